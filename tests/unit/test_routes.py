import pytest

from sitsprobe import routes
from sitsprobe.routes import RouteMapper

TEMPLATES = ["/v1/models/{model}/infer", "/users/me", "/users/{id}", "/files/{a}/{b}"]


@pytest.mark.parametrize(
    "path, route",
    [
        ("/v1/models/llama-3-8b/infer", "/v1/models/{model}/infer"),
        ("/v1/models/x/infer", "/v1/models/{model}/infer"),
        ("/users/me", "/users/me"),  # first matching template wins
        ("/users/alice", "/users/{id}"),
        ("/files/a/b", "/files/{a}/{b}"),
        # no match: a placeholder needs a non-empty segment, counts must agree
        ("/v1/models//infer", "/v1/models//infer"),
        ("/users/", "/users/"),
        ("/users/alice/", "/users/alice/"),
        ("/users/alice/posts", "/users/alice/posts"),
        ("/v1/models/x/infer/extra", "/v1/models/x/infer/extra"),
        ("/V1/models/x/infer", "/V1/models/x/infer"),
    ],
)
def test_templates(path, route):
    assert RouteMapper(TEMPLATES).route(path) == route


@pytest.mark.parametrize(
    "path, route",
    [
        ("/users/42", "/users/{id}"),
        ("/users/42/", "/users/{id}/"),
        ("/orders/0/items/123456789012345678901", "/orders/{id}/items/{id}"),
        ("/jobs/3f2504e0-4f89-11d3-9a0c-0305e82c3301", "/jobs/{id}"),
        ("/jobs/3F2504E0-4F89-11D3-9A0C-0305E82C3301/log", "/jobs/{id}/log"),
        ("/jobs/12345678-1234-1234-1234-123456789012", "/jobs/{id}"),  # all-digit UUID
        ("/jobs/abcdefab-cdef-abcd-efab-cdefabcdefab", "/jobs/{id}"),  # all-letter UUID
        ("/blob/deadbeefdeadbeef", "/blob/{id}"),  # hex, 16
        ("/blob/DEADBEEFDEADBEEF00", "/blob/{id}"),
        ("/blob/deadbeefdeadbee", "/blob/deadbeefdeadbee"),  # hex, 15, no digits
        ("/v1/chat/chatcmpl-8f7a6b5c", "/v1/chat/{id}"),  # mixed, 12+
        ("/v1/chat/cmpl_AbC12x", "/v1/chat/cmpl_AbC12x"),  # mixed, 11
        ("/v1/chat/cmpl_AbC12xy", "/v1/chat/{id}"),  # mixed, 12
        ("/v1/chat/completions", "/v1/chat/completions"),  # letters only
        ("/api/v2/items", "/api/v2/items"),
        ("/static/app.1a2b3c4d5e6f.js", "/static/app.1a2b3c4d5e6f.js"),  # "." is no id char
        ("/n/\u0663\u0664", "/n/\u0663\u0664"),  # non-ASCII digits
        ("/n/12\u00b2", "/n/12\u00b2"),
        ("/", "/"),
        ("//", "//"),
        ("", "/"),
        ("*", "*"),
    ],
)
def test_collapse_ids(path, route):
    assert RouteMapper().route(path) == route


def test_template_before_collapse_and_collapse_off():
    assert RouteMapper(["/users/{user}"]).route("/users/42") == "/users/{user}"
    plain = RouteMapper(collapse_ids=False)
    assert plain.route("/users/42") == "/users/42"
    assert plain.route("") == "/"


def test_none_is_unknown():
    m = RouteMapper(max_routes=0)
    assert m.route(None) == "unknown"
    assert m.overflowed == 0


def test_bounded_cardinality():
    m = RouteMapper(["/t/{x}"], max_routes=3)
    assert [m.route(f"/r{i}") for i in range(3)] == ["/r0", "/r1", "/r2"]
    assert m.route("/r3") == "other"
    assert m.route("/r4") == "other"
    assert m.route("/r3") == "other"
    assert m.overflowed == 3
    assert m.route("/r1") == "/r1"  # routes already handed out keep their label
    assert m.route("/r9/17") == "other"
    assert m.route("/t/anything") == "/t/{x}"  # configured templates are always returned
    assert m.overflowed == 4


def test_collapsed_ids_do_not_use_up_routes():
    m = RouteMapper(max_routes=2)
    assert {m.route(f"/users/{i}") for i in range(1000)} == {"/users/{id}"}
    assert m.overflowed == 0


def test_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(routes, "CACHE_SIZE", 100)
    m = RouteMapper(max_routes=10_000)
    for i in range(1000):
        assert m.route(f"/p{i}/{i}") == f"/p{i}/{{id}}"
        assert len(m._cache) <= 100
    assert m.route("/p1/1") == "/p1/{id}"
    assert m.overflowed == 0
