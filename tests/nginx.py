"""A static nginx site for the load test and the HTTP benchmark: one worker,
a 380-byte index.html, access_log off, sendfile on, keep-alive without limit."""
from __future__ import annotations

from pathlib import Path

NGINX_CONF = """\
user root;
worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    keepalive_requests 1000000;
    client_body_temp_path {d}/tmp;
    proxy_temp_path {d}/tmp;
    fastcgi_temp_path {d}/tmp;
    uwsgi_temp_path {d}/tmp;
    scgi_temp_path {d}/tmp;
    server {{
        listen 127.0.0.1:{port}{listen};
        location / {{ root {d}/www; }}
{locations}
    }}
}}
"""


def static_site(d: Path, port: int, locations: str = "", tls: tuple[str, str] | None = None) -> list[str]:
    """Write the site and its config under d, with more `location` blocks if
    given, over HTTPS with ``tls`` (certificate, key); the nginx command that serves it."""
    (d / "www").mkdir(parents=True)
    (d / "tmp").mkdir()
    (d / "www" / "index.html").write_text("<h1>sitsprobe</h1>\n" * 20)
    listen = f" ssl;\n        ssl_certificate {tls[0]};\n        ssl_certificate_key {tls[1]}" if tls else ""
    (d / "nginx.conf").write_text(NGINX_CONF.format(d=d, port=port, locations=locations, listen=listen))
    return ["nginx", "-c", str(d / "nginx.conf"), "-p", str(d)]
