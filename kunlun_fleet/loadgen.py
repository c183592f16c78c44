"""A small load generator for the fleet endpoint (the upgrade and driver-pass tests under load).

Clients send chat completions (streamed) and completions through the endpoint with the
official openai client until stopped. The client never retries (max_retries=0): the tests
count lost requests through it, and a retry would hide a request the fleet failed (a drain
that answered 502, a restart that refused a connection); a retry the fleet needs is the
gateway's. A request counts as served only when it ended with a finish reason and the
server's count of its tokens; anything else (an error, a stream cut in the middle, an
answer without its usage) is counted as lost."""

import threading
import time


class Load:
    def __init__(self, url, model, api_key, clients=4, max_tokens=24):
        import openai

        self.model, self.max_tokens = model, max_tokens
        self.client = openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key=api_key, max_retries=0, timeout=120)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ok, self.failed, self.tokens = 0, [], 0
        # When each served request ended (time.monotonic(): CLOCK_MONOTONIC, the clock a
        # host's systemd stamps its units' starts with, so the two can be ordered).
        self.served_at = []
        self.started = self.ended = None
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def _one(self, streamed):
        """(text, completion tokens as the server counted them, finish reason)."""
        if not streamed:
            out = self.client.completions.create(model=self.model, prompt="The sea", max_tokens=self.max_tokens)
            return out.choices[0].text, out.usage.completion_tokens if out.usage else None, out.choices[0].finish_reason
        text, tokens, finish = "", None, None
        stream = self.client.chat.completions.create(
            model=self.model,
            stream=True,
            max_tokens=self.max_tokens,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "Hello"}],
        )
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        return text, tokens, finish

    def _run(self, index):
        while not self.stop.is_set():
            try:
                text, tokens, finish = self._one(streamed=index % 2 == 0)
                with self.lock:
                    if text and finish and tokens:
                        self.ok += 1
                        self.tokens += tokens
                        self.served_at.append(time.monotonic())
                    else:
                        self.failed.append(
                            "incomplete answer: finish_reason=%r, completion_tokens=%r, %d characters"
                            % (finish, tokens, len(text))
                        )
            except Exception as exc:  # every failure counts: nothing may be lost
                with self.lock:
                    self.failed.append(repr(exc))

    def __enter__(self):
        self.started = time.monotonic()
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=180)
        self.ended = time.monotonic()

    def summary(self):
        wall = (self.ended or time.monotonic()) - self.started
        return {
            "requests_ok": self.ok,
            "requests_failed": len(self.failed),
            "output_tokens": self.tokens,
            "wall_s": round(wall, 1),
            "output_tok_s": round(self.tokens / wall, 1) if wall else 0.0,
        }
