"""probes.maps.discard: an entry out of a BPF map that the kernel may take out too."""
from collections.abc import MutableMapping

import pytest

from sitsprobe.probes.maps import discard


class KernelTakesItOut(MutableMapping):
    """A bcc table (bcc's are MutableMappings: pop() looks the entry up, then
    deletes it) whose entry the kernel deletes right after it is looked up:
    a connection it closed meanwhile."""

    def __init__(self, **entries):
        self.entries = entries

    def __getitem__(self, key):
        return self.entries.pop(key)

    def __delitem__(self, key):
        del self.entries[key]  # bcc raises KeyError where the map's delete fails

    def __setitem__(self, key, value):
        self.entries[key] = value

    def __iter__(self):
        return iter(self.entries)

    def __len__(self):
        return len(self.entries)


def test_discard_takes_out_an_entry_whether_or_not_the_kernel_took_it_out_first():
    """pop(key, None) raised KeyError when the kernel deleted the entry
    between its look-up and its delete: the agent stopped (CI, forgetting an
    exiting HAProxy's connections). discard deletes once and ignores absence."""
    with pytest.raises(KeyError):
        KernelTakesItOut(conn=1).pop("conn", None)
    table = KernelTakesItOut(conn=1, other=2)
    discard(table, "other")  # there: taken out
    discard(table, "missing")  # not there: nothing to do
    assert dict(table.entries) == {"conn": 1}
