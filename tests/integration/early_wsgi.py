"""A WSGI app for gunicorn's sync worker (test_half_close.py), which ends
every connection as its authors chose: it shuts its sending side, reads
what the client still sends until the client closes, then closes.

    python -m gunicorn --chdir tests/integration early_wsgi:app

PUT: 404 from the request's head, its body never read by the app (an app
that rejects an upload), so the body the client sends after the answer is
read in that lingering close. Anything else: 200, "hello\\n".
"""


def app(environ, start_response):
    if environ["REQUEST_METHOD"] == "PUT":
        body = b"nope\n"
        start_response("404 Not Found", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    else:
        body = b"hello\n"
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
