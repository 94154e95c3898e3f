# A dev server for the exposed-port tests: python3's http.server serving
# this directory, plus /events (server-sent events, one every 400 ms),
# /ws (a WebSocket echo), /headers (the request's Cookie and
# Authorization, to show what reached the sandbox) and /setcookies (sets
# its own cookie and two named like the daemon's). Standard library only.
import base64, hashlib, http.server, json, struct, sys, time

class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path.startswith("/events"):
            return self.events()
        if self.path.startswith("/ws"):
            return self.websocket()
        if self.path.startswith("/setcookies"):
            self.send_response(200)
            self.send_header("Set-Cookie", "app=2; Path=/")
            self.send_header("Set-Cookie", "hearth_preview_1=tossed; Path=/")
            self.send_header("Set-Cookie", " HEARTH_PREVIEW_2=tossed")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith("/headers"):
            body = json.dumps({"cookie": self.headers.get("Cookie", ""), "authorization": self.headers.get("Authorization", "")}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        return super().do_GET()

    def events(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(3):
            self.wfile.write(("data: tick %d\n\n" % i).encode())
            self.wfile.flush()
            time.sleep(0.4)
        self.close_connection = True

    def websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        r = self.rfile
        while True:
            h = r.read(2)
            if len(h) < 2:
                return
            op, n = h[0] & 15, h[1] & 127
            if n == 126:
                n = struct.unpack(">H", r.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", r.read(8))[0]
            mask = r.read(4) if h[1] & 128 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
            if op == 8:
                self.wfile.write(b"\x88\x00")
                self.wfile.flush()
                return
            if op == 1:
                out = b"echo:" + data
                hdr = bytes([0x81, len(out)]) if len(out) < 126 else bytes([0x81, 126]) + struct.pack(">H", len(out))
                self.wfile.write(hdr + out)
                self.wfile.flush()

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
