"""A threading HTTP server answering every ``GET`` after a delay (the server's, or the request's
``?delay_ms=N``, drawn within ``±jitter_pct`` % of it when the request gives one), in a process
of its own.

``tests/servers.py``'s :func:`~servers.http_server` runs it as ``python -I slow_http_server.py
DELAY_S``: it binds a free loopback port, prints it on a line of its own and serves until it is
terminated. Its threads are not the tested process's: in the same process, its 16 handler
threads would queue for the tested pool's interpreter lock beside the pool's own workers (a
well-sized httpx pool's own mutex read as contended while its holder waited for the interpreter
behind them), which is not what the pool tests measure. Standard library only (``-I`` leaves
out the environment's ``PYTHONPATH``, so lockwatch's bootstrap never watches it).
"""

from __future__ import annotations

import http.server
import random
import sys
import time
import urllib.parse


class SlowHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    delay_s = 0.01
    # The headers and the body go out in two writes: with Nagle's algorithm the body waits for
    # the client's delayed ACK (40 ms), four times the delay a request is meant to take.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        delay_s = int(query["delay_ms"][0]) / 1000 if "delay_ms" in query else self.delay_s
        if "jitter_pct" in query:
            spread = int(query["jitter_pct"][0]) / 100
            delay_s *= random.uniform(1 - spread, 1 + spread)
        time.sleep(delay_s)  # the server's work: the client holds its connection meanwhile
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


class Server(http.server.ThreadingHTTPServer):
    # Every connection a pool of 16 opens at once is accepted at once (socketserver's default
    # backlog was 5 until 3.15: the connects past it waited for a SYN retransmission, 1 s).
    request_queue_size = 128
    daemon_threads = True


def main(argv: list[str]) -> None:
    SlowHandler.delay_s = float(argv[1])
    server = Server(("127.0.0.1", 0), SlowHandler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv)
