"""sitsprobe.redact: every query value is REDACTED unless its name is kept."""
from __future__ import annotations

import random
import re
from urllib.parse import unquote_plus

import pytest

from sitsprobe.redact import REDACTED, redact_query, redact_target

NONE: frozenset[str] = frozenset()


def test_every_value_is_redacted_by_default():
    assert redact_query("api_key=SECRET&token=SECRET2", NONE) == "api_key=REDACTED&token=REDACTED"
    assert redact_query("api_key=SECRET&token=SECRET2") == "api_key=REDACTED&token=REDACTED"


def test_kept_names_keep_their_values():
    keep = frozenset({"stream", "model"})
    assert (redact_query("model=llama&api_key=SECRET&stream=true", keep)
            == "model=llama&api_key=REDACTED&stream=true")


def test_names_are_case_sensitive():
    assert redact_query("Stream=true&stream=false", frozenset({"stream"})) == "Stream=REDACTED&stream=false"


@pytest.mark.parametrize("query,expected", [
    ("debug", "debug"),                                   # a name without "=" stays
    ("debug&token=x", "debug&token=REDACTED"),
    ("a=", "a="),                                         # an empty value stays empty
    ("a=&b=1", "a=&b=REDACTED"),
    ("=x", "=REDACTED"),                                  # an empty name still hides its value
    ("=", "="),
    ("", ""),
    ("&&", "&&"),
    ("a=1&&b=2&", "a=REDACTED&&b=REDACTED&"),
    ("token=a=b", "token=REDACTED"),                     # the value runs to the separator
    ("token=1&token=2&token=3", "token=REDACTED&token=REDACTED&token=REDACTED"),
    ("a=1;token=SECRET", "a=REDACTED;token=REDACTED"),    # ";" separates too
    ("q=%20x%26y+z", "q=REDACTED"),
])
def test_shapes(query, expected):
    assert redact_query(query, NONE) == expected


def test_repeated_kept_name_keeps_every_value():
    assert redact_query("id=1&x=2&id=3", frozenset({"id"})) == "id=1&x=REDACTED&id=3"


def test_semicolon_cannot_smuggle_a_value_through_a_kept_name():
    assert redact_query("stream=true;api_key=SECRET", frozenset({"stream"})) == "stream=true;api_key=REDACTED"


def test_names_are_compared_percent_decoded_and_shown_as_sent():
    keep = frozenset({"api_key", "page size"})
    assert redact_query("api%5Fkey=x&api%5fkey=y&page+size=10&page%20size=20", keep) == (
        "api%5Fkey=x&api%5fkey=y&page+size=10&page%20size=20")
    assert redact_query("api%5Fkey=SECRET", frozenset({"api%5Fkey"})) == "api%5Fkey=REDACTED"
    assert redact_query("bad%zz=1&%ff=2", frozenset({"bad%zz"})) == "bad%zz=1&%ff=REDACTED"


def test_target():
    keep = frozenset({"stream"})
    assert redact_target("/v1/chat?api_key=SECRET&stream=true", keep) == "/v1/chat?api_key=REDACTED&stream=true"
    assert redact_target("/v1/models", keep) == "/v1/models"
    assert redact_target("/v1/models?", keep) == "/v1/models?"
    assert redact_target("/p?token=SECRET#frag=x", keep) == "/p?token=REDACTED"
    assert redact_target("/p#frag?token=SECRET", keep) == "/p"
    assert redact_target("/p?a=1?token=SECRET", keep) == "/p?a=REDACTED"  # the first "?" starts the query
    assert redact_target("http://host:8000/p?token=SECRET", keep) == "http://host:8000/p?token=REDACTED"
    assert redact_target("", keep) == ""
    assert redact_target(None, keep) is None


def test_hostile_sizes_stay_linear():
    amps = "&" * 200_000
    assert redact_query(amps, NONE) == amps
    many = "a=b&" * 50_000
    assert redact_query(many, frozenset({"x"})) == "a=REDACTED&" * 50_000
    percents = "%" * 200_000 + "=v"
    assert redact_query(percents, frozenset({"x"})) == "%" * 200_000 + "=REDACTED"


def test_random_text_never_raises_and_matches_the_rule():
    """Random bytes (latin-1 text, so every separator and "%" occurs), plus lone
    surrogates: the output has the input's pieces, each value hidden or kept."""
    rng = random.Random(9)
    alphabet = "&;=%+ab_5F"
    for _ in range(3000):
        if rng.random() < 0.5:
            query = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 80))).decode("latin-1")
        else:
            query = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        if rng.random() < 0.1:
            query += "\ud800=\udfff"
        keep = frozenset(rng.sample(["a", "b", "a_b", "ab", "", " "], rng.randrange(0, 3)))
        out = redact_query(query, keep)
        ins, outs = re.split("([&;])", query), re.split("([&;])", out)
        assert len(ins) == len(outs) and ins[1::2] == outs[1::2]
        for before, after in zip(ins[::2], outs[::2]):
            name, eq, value = before.partition("=")
            kept = not value or unquote_plus(name) in keep  # the stdlib decodes, as servers do
            assert after == (before if kept else name + eq + REDACTED)


def test_secrets_never_come_out():
    """A secret value after random junk, under any name not kept, never
    reaches the output."""
    rng = random.Random(6)
    keep = frozenset({"stream", "model"})
    for i in range(2000):
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))).decode("latin-1")
        secret = f"S3CR3T{i}x"
        name = rng.choice(["api_key", "token", "api%5Fkey", "Stream", "", "sig", junk.strip("&;=")])
        sep = rng.choice("&;")
        query = f"{junk}{sep}{name}={secret}{rng.choice(['', '&', ';', '&stream=1'])}"
        target = f"/v1/x?{query}#{rng.choice(['', secret])}"
        if unquote_plus(re.split("[&;]", name)[-1]) not in keep:
            assert secret not in redact_query(query, keep)
            assert secret not in redact_target(target, keep)
