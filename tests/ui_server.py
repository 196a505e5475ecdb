"""The agent UI's app served by uvicorn on a loopback port from a background thread, for the
UI's tests (HTTP and browser)."""

import contextlib
import socket
import threading

import uvicorn


@contextlib.contextmanager
def serving(app):
    """Yields the base URL of ``app`` served on a free loopback port.  The socket listens before
    the server starts, so clients may connect at once (their connections wait in its queue)."""
    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
