"""A small HTTP/1.1 server for the demo (the stdlib's, keep-alive on).

    python examples/hello_server.py PORT
"""
import random
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes

    def do_GET(self):
        if self.path.startswith("/slow"):
            time.sleep(random.uniform(0.02, 0.08))
        status = 404 if self.path.startswith("/missing") else 500 if self.path.startswith("/boom") else 200
        body = f"{status} {self.path}\n".encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
