#!/usr/bin/env python3
"""Local stand-ins for scripts/demo.sh's `jira_search` (examples/jira.yaml),
so that nothing leaves this machine. Standard library only.

    jira-standin.py certs DIR        a demo CA and a leaf for jira.example
                                     (DIR/ca.pem, DIR/jira.pem, DIR/jira.key)
    jira-standin.py serve DIR ADDR   the Jira API over HTTPS on ADDR (host:port)
                                     with that leaf; each request's
                                     Authorization header is appended to
                                     DIR/received (the demo shows it)
    jira-standin.py mint DIR         an `exec` credential provider: the
                                     request on stdin, a fresh token out
                                     (also appended to DIR/minted)
    jira-standin.py revoke DIR       its revoke command: the token on stdin,
                                     appended to DIR/revoked

A real deployment points the provider at its IdP (docs/secrets.md) and the
manifest at the real API host; the stand-ins only record what they get so
the demo can show the token reached the API and nowhere else.
"""
import datetime
import http.server
import json
import os
import secrets
import ssl
import subprocess
import sys
import time


def certs(d):
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ca_key, ca = os.path.join(d, "ca.key"), os.path.join(d, "ca.pem")
    key, csr, crt = (os.path.join(d, n) for n in ("jira.key", "jira.csr", "jira.pem"))
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", ca_key, "-out", ca, "-days", "1", "-subj", "/CN=cordon demo CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", key, "-out", csr, "-subj", "/CN=jira.example")
    ext = os.path.join(d, "leaf.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:jira.example\nbasicConstraints=CA:FALSE\n"
                "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n")
    run("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
        "-out", crt, "-days", "1", "-extfile", ext)


ISSUES = [
    {"key": "OPS-101", "fields": {"summary": "Rotate the build cache credentials"}},
    {"key": "OPS-117", "fields": {"summary": "Sandbox agent tools behind cordon"}},
]


def serve(d, addr):
    host, port = addr.rsplit(":", 1)

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            with open(os.path.join(d, "received"), "a") as f:
                f.write(f"{self.path} {self.headers.get('Authorization', '(none)')}\n")
            if not self.path.startswith("/rest/api/2/search"):
                self.send_error(404)
                return
            if not (self.headers.get("Authorization") or "").startswith("Bearer jira-demo-"):
                self.send_error(401, "no valid token")
                return
            body = json.dumps({"total": len(ISSUES), "issues": ISSUES}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer((host, int(port)), H)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.path.join(d, "jira.pem"), os.path.join(d, "jira.key"))
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.serve_forever()


def mint(d):
    req = json.load(sys.stdin)
    tok = "jira-demo-" + secrets.token_hex(16)
    with open(os.path.join(d, "minted"), "a") as f:
        f.write(tok + "\n")
    exp = datetime.datetime.fromtimestamp(time.time() + int(req["ttl"]), datetime.timezone.utc)
    print(json.dumps({"token": tok, "expires_at": exp.isoformat()}))


def revoke(d):
    tok = sys.stdin.read().strip()
    with open(os.path.join(d, "revoked"), "a") as f:
        f.write(tok + "\n")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    cmd, d = sys.argv[1], sys.argv[2]
    if cmd == "certs":
        certs(d)
    elif cmd == "serve" and len(sys.argv) == 4:
        serve(d, sys.argv[3])
    elif cmd == "mint":
        mint(d)
    elif cmd == "revoke":
        revoke(d)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
