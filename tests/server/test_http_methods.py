"""HTTP methods on the port's routes, on the wire (issue 17, "HEAD returns a body; POST
and DELETE on GET routes are treated as GET. Answer 405.").

Before this (main at b923685) a 405 carried no ``Allow`` header (RFC 9110 15.5.6 makes it
a MUST) and the routes outside /v1 answered it with ``{"error": "not_found"}``."""

from __future__ import annotations

from tests.server.raw_http import call, exchange, parse, request

GET_ROUTES = ("/healthz", "/metrics", "/v1/models", "/", "/ws")
POST_ROUTES = ("/v1/completions", "/v1/chat/completions", "/reset_prefix_cache")


def test_head_is_get_without_its_body(make_server):
    server = make_server()
    port = server.port
    for path in GET_ROUTES:
        got, head = call(port, "GET", path), call(port, "HEAD", path)
        assert (head.status, got.status) == (200, 200), path
        assert head.headers["content-type"] == got.headers["content-type"], path
        assert head.body == b"" and got.body, path
    # /v1/models does not change between two calls: the lengths are the same exactly
    assert call(port, "HEAD", "/v1/models").headers["content-length"] == \
        str(len(call(port, "GET", "/v1/models").body))
    # no body bytes hide behind a HEAD: the next response on the connection starts at once
    data = exchange(port, request("HEAD", "/v1/models", host=f"127.0.0.1:{port}"),
                    request("GET", "/healthz", host=f"127.0.0.1:{port}", headers={"Connection": "close"}))
    first = parse(data, head=True)
    assert first.status == 200 and int(first.headers["content-length"]) > 0
    second = parse(first.rest)
    assert second.status == 200 and second.json()["status"] == "ready"


def test_other_methods_on_get_routes_are_405_with_allow(make_server):
    server = make_server()
    for path in GET_ROUTES:
        for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
            r = call(server.port, method, path)
            assert r.status == 405, (method, path, r)
            assert r.headers["allow"] == "GET, HEAD", (method, path)
            body = r.json()
            message = f"{method} is not allowed on {path}; it takes GET, HEAD"
            if path.startswith("/v1"):  # OpenAI's error shape
                assert body == {"error": {"message": message, "type": "invalid_request_error",
                                          "param": None, "code": "method_not_allowed"}}
            else:
                assert body == {"error": "method_not_allowed", "detail": message}
    # a POST on a GET route never runs it as a GET (the engine saw no op)
    assert call(server.port, "GET", "/healthz").json()["api_calls"] == 0


def test_get_on_post_routes_is_405_in_openais_shape(make_server):
    server = make_server()
    for path in POST_ROUTES:
        for method in ("GET", "PUT", "DELETE", "PATCH"):
            r = call(server.port, method, path)
            assert (r.status, r.headers["allow"]) == (405, "POST"), (method, path)
            assert r.json() == {"error": {"message": f"{method} is not allowed on {path}; it takes POST",
                                          "type": "invalid_request_error", "param": None,
                                          "code": "method_not_allowed"}}
        head = call(server.port, "HEAD", path)
        assert (head.status, head.headers["allow"], head.body) == (405, "POST", b"")
    # unknown paths stay 404, in the shape of their side of the port
    assert call(server.port, "GET", "/v1/nothing").json()["error"]["code"] == "not_found"
    r = call(server.port, "DELETE", "/nothing")
    assert r.status == 404 and r.json()["error"] == "not_found" and "allow" not in r.headers
