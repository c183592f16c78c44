# SPDX-License-Identifier: Apache-2.0
"""TLS on the API server's port, as vllm 0.15.1 serves it through uvicorn.

vllm passes --ssl-keyfile, --ssl-certfile, --ssl-ca-certs, --ssl-cert-reqs and
--ssl-ciphers to uvicorn.Config (vllm/entrypoints/openai/api_server.py,
run_server_worker), whose load() builds the context after the engine is up
(vllm/entrypoints/launcher.py, serve_http; uvicorn/config.py, create_ssl_context): an
ssl.SSLContext(PROTOCOL_TLS_SERVER) - Python's defaults, TLS 1.2 and 1.3 -, the chain
loaded from the two files, verify_mode from --ssl-cert-reqs (0, no client certificate,
by default), the CA file loaded when given, the ciphers set when given; no ALPN. The port
is TLS whenever a key or a certificate file is given; a key without a certificate is
uvicorn's AssertionError. --enable-ssl-refresh reloads the chain when the key or the
certificate file changes, and the CA file when it changes (vllm/entrypoints/ssl.py,
SSLCertRefresher, with watchfiles; here the files' status is polled every second).
"""

import asyncio
import os
import ssl

from vllm.logger import init_logger

logger = init_logger("vllm.entrypoints.ssl")


def create_ssl_context(certfile, keyfile, cert_reqs, ca_certs, ciphers) -> ssl.SSLContext:
    """uvicorn's create_ssl_context (uvicorn/config.py), without a key password."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certfile, keyfile)
    ctx.verify_mode = ssl.VerifyMode(cert_reqs)
    if ca_certs:
        ctx.load_verify_locations(ca_certs)
    if ciphers:
        ctx.set_ciphers(ciphers)
    return ctx


def server_ssl_context(args):
    """The listener's context from the server's arguments, or None for plain HTTP
    (uvicorn's Config.is_ssl and load())."""
    if not (args.ssl_keyfile or args.ssl_certfile):
        return None
    assert args.ssl_certfile
    return create_ssl_context(
        args.ssl_certfile, args.ssl_keyfile, int(args.ssl_cert_reqs or 0), args.ssl_ca_certs, args.ssl_ciphers
    )


def _stamp(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class SSLCertRefresher:
    """vllm's SSLCertRefresher: reloads the chain (and the CA file) into the running
    context when the files change; a failed reload is logged and the old chain stays."""

    def __init__(self, ssl_context, key_path=None, cert_path=None, ca_path=None):
        self.ssl = ssl_context
        self.key_path, self.cert_path, self.ca_path = key_path, cert_path, ca_path
        self.tasks = []
        if self.key_path and self.cert_path:
            self.tasks.append(asyncio.ensure_future(self._watch([key_path, cert_path], self._chain)))
        if self.ca_path:
            self.tasks.append(asyncio.ensure_future(self._watch([ca_path], self._ca)))

    def _chain(self):
        logger.info("Reloading SSL certificate chain")
        self.ssl.load_cert_chain(self.cert_path, self.key_path)

    def _ca(self):
        logger.info("Reloading SSL CA certificates")
        self.ssl.load_verify_locations(self.ca_path)

    async def _watch(self, paths, action):
        logger.info("SSLCertRefresher monitors files: %s", paths)
        stamps = [_stamp(p) for p in paths]
        while True:
            await asyncio.sleep(1.0)
            now = [_stamp(p) for p in paths]
            for path, old, new in zip(paths, stamps, now, strict=True):
                if old != new:
                    logger.info("File change detected: %s - %s", "modified" if new else "deleted", path)
                    try:
                        action()
                    except Exception as exc:
                        logger.error("SSLCertRefresher failed taking action on file change. Error: %s", exc)
            stamps = now

    def stop(self):
        for task in self.tasks:
            task.cancel()
        self.tasks = []
