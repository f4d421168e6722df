"""Request._replace: by index, the same as a NamedTuple's own."""
import pytest

from sitsprobe.request import Endpoint, Request


def request() -> Request:
    return Request(42, "nginx", 7, 1_000, 3_000, 2_000, 80, 618, Endpoint("127.0.0.1", 80),
                   Endpoint("127.0.0.1", 41800), method="GET", target="/a?b", path="/a", route="/a",
                   status=200, head=b"GET /a?b HTTP/1.1\r\n\r\n")


def test_every_field_is_replaced_as_a_named_tuple_replaces_it():
    r = request()
    for i, name in enumerate(Request._fields):
        new = r._replace(**{name: ("new", i)})
        assert type(new) is Request and new[i] == ("new", i)
        assert new == tuple(("new", i) if j == i else v for j, v in enumerate(r))
    several = r._replace(binned=True, head=b"", status=404, pid=1)
    assert (several.binned, several.head, several.status, several.pid, several.fd) == (True, b"", 404, 1, 7)
    assert r._replace() == r and r.binned is False and r.head  # the original is left as it was


def test_a_name_it_has_not_is_refused():
    with pytest.raises(ValueError, match="'nope'"):
        request()._replace(status=1, nope=2)
