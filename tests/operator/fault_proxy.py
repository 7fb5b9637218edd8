"""A plain-HTTP proxy in front of the kube-apiserver that answers the first N
requests matching METHOD and a path prefix with a 409 Conflict (a Status, as
the API server sends it), and passes everything else through, watches
included (streamed chunk by chunk).

    python3 fault_proxy.py LISTEN_PORT https://127.0.0.1:API_PORT PATCH /apis/apps/v1/namespaces/default/deployments/md-409 1

Each request is logged on stdout as "<METHOD> <path> -> <status>[ injected]".
"""

import http.client
import http.server
import json
import ssl
import sys
import threading
import urllib.parse

LISTEN, UPSTREAM, METHOD, PREFIX, COUNT = (
    int(sys.argv[1]), urllib.parse.urlsplit(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]))
left = COUNT
lock = threading.Lock()
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "proxy-connection"}

CONFLICT = json.dumps({
    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
    "message": "Operation cannot be fulfilled: injected conflict (tests/operator/fault_proxy.py)",
    "reason": "Conflict", "code": 409,
}).encode()


def log(line: str) -> None:
    print(line, flush=True)


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # noqa: D401 - quiet; we log our own line
        pass

    def handle_any(self):
        global left
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else None
        with lock:
            inject = self.command == METHOD and self.path.startswith(PREFIX) and left > 0
            if inject:
                left -= 1
        if inject:
            self.send_response(409)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(CONFLICT)))
            self.end_headers()
            self.wfile.write(CONFLICT)
            log(f"{self.command} {self.path} -> 409 injected")
            return
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        up = http.client.HTTPSConnection(UPSTREAM.hostname, UPSTREAM.port, context=ctx, timeout=600)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        try:
            up.request(self.command, self.path, body=body, headers=headers)
            resp = up.getresponse()
        except OSError as e:
            self.send_error(502, f"upstream: {e}")
            log(f"{self.command} {self.path} -> 502 ({e})")
            return
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in HOP:
                self.send_header(k, v)
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        log(f"{self.command} {self.path} -> {resp.status}")
        try:
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True
        finally:
            up.close()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = handle_any


server = http.server.ThreadingHTTPServer(("127.0.0.1", LISTEN), Proxy)
server.daemon_threads = True
log(f"listening on {LISTEN}, {COUNT} x 409 for {METHOD} {PREFIX}")
server.serve_forever()
