"""A WSGI app that streams, for gunicorn's sync worker (test_hangup.py):
gunicorn writes each piece as a chunk as the app yields it, and ends the
connection after each answer.

    python -m gunicorn --chdir tests/integration stream_wsgi:app

POST any path ?events=N&gap=S&abort=K&linger=L: an OpenAI chat stream of
N events (peers.chunks), S seconds apart, the body's end L seconds after
[DONE] (gunicorn writes it whether or not the client is still there); with
abort=K, the app raises before event K, and gunicorn closes the connection
mid-body (the answer's head is sent: no 500 can follow).
"""
import time
from urllib.parse import parse_qs

from peers import chunks


def app(environ, start_response):
    query = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
    events, gap, abort = int(query.get("events", 5)), float(query.get("gap", 0)), int(query.get("abort", -1))
    linger = float(query.get("linger", 0))
    length = int(environ.get("CONTENT_LENGTH") or 0)
    environ["wsgi.input"].read(length)
    start_response("200 OK", [("Content-Type", "text/event-stream")])

    def stream():
        for i, chunk in enumerate(chunks(events)):
            if i == abort:
                raise RuntimeError(f"the app gives up after {i} events")
            if i:
                time.sleep(gap)
            yield chunk
        time.sleep(linger)
    return stream()
