"""Send raw HTTP requests to the proxy door, one connection each; print status and body."""
import json
import socket
import sys

port = int(sys.argv[1])
requests = json.loads(sys.argv[2])
out = []
for raw in requests:
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall(raw.encode())
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        if not chunk:
            break
        data += chunk
        if b"\r\n\r\n" in data:
            head, _, body = data.partition(b"\r\n\r\n")
            lengths = [
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ]
            if lengths and len(body) >= lengths[0]:
                break
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    out.append({"status": head.split(b"\r\n")[0].decode(), "body": body.decode(errors="replace")})
print(json.dumps(out))
