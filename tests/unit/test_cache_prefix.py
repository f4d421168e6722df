"""Key prefixes: what is exported instead of a key, and what never is."""
import hashlib

import pytest

from sitsprobe.cache.prefix import MAX_LABEL, NO_MATCH, NO_PREFIX, PrefixExtractor


def test_first_segment_by_default():
    p = PrefixExtractor()
    assert p(b"user:1234:profile") == "user"
    assert p("session:abc") == "session"
    assert p(b":leading") == ""


def test_more_segments_never_take_the_whole_key():
    p = PrefixExtractor(segments=2)
    assert p(b"user:1234:profile") == "user:1234"
    assert p(b"user:1234") == "user"  # two segments would be the whole key
    assert p(b"a:b:c:d") == "a:b"


def test_a_key_without_delimiter_is_all_key():
    assert PrefixExtractor()(b"counter12345") == NO_PREFIX
    assert PrefixExtractor(delimiter="/")(b"user:1") == NO_PREFIX
    assert PrefixExtractor(delimiter="/")(b"tenant/a/b") == "tenant"


def test_truncated_key_head():
    p = PrefixExtractor()
    assert p(b"user:" + b"x" * 59, truncated=True) == "user"
    assert p(b"y" * 64, truncated=True) == NO_PREFIX


def test_regex_group_whole_match_and_no_match():
    assert PrefixExtractor(regex=r"^(\w+)-\d+")(b"order-77-x") == "order"
    assert PrefixExtractor(regex=r"^[a-z]+")(b"abc123") == "abc"
    assert PrefixExtractor(regex=r"^(\w+)-\d+")(b"nothing") == NO_MATCH
    assert PrefixExtractor(regex=r"^(a)?b")(b"b") == NO_MATCH  # the group took no part


def test_hashing_is_blake2b_8_bytes_hex_and_stable():
    p = PrefixExtractor(hash_keys=True)
    want = hashlib.blake2b(b"user", digest_size=8).hexdigest()
    assert p(b"user:1") == want == p(b"user:2") and len(want) == 16
    assert p(b"nodelimiter") == NO_PREFIX  # nothing to hash


def test_raw_keys_only_when_asked():
    assert PrefixExtractor(export_raw_keys=True)(b"user:1") == "user:1"
    assert PrefixExtractor(export_raw_keys=True)(b"user:1", truncated=True) == "user:1..."
    assert PrefixExtractor()(b"user:1") == "user"


def test_binary_keys_and_long_prefixes():
    p = PrefixExtractor()
    assert p(b"\xff\xfe:1") == "\\xff\\xfe"
    assert len(p(b"z" * 300 + b":1")) == MAX_LABEL


def test_bad_settings():
    with pytest.raises(ValueError):
        PrefixExtractor(delimiter="")
    with pytest.raises(ValueError):
        PrefixExtractor(segments=0)
