"""What a run prints or stores is masked: the inventory's vaulted values and any bearer
token become ********; ANSI escapes are stripped where text is kept."""

import re

MASK = "********"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9\-._~+/]+=*")


class Masker:
    """Replaces the inventory's vaulted values and any `Bearer <token>` with ********."""

    def __init__(self, secrets=()):
        self.secrets = re.compile("|".join(re.escape(s) for s in secrets)) if secrets else None

    def text(self, text):
        if not isinstance(text, str) or not text:
            return text
        if self.secrets is not None:
            text = self.secrets.sub(MASK, text)
        return BEARER.sub(lambda m: m.group(1) + MASK, text)

    def obj(self, data):
        if isinstance(data, str):
            return self.text(data)
        if isinstance(data, dict):
            return {k: self.obj(v) for k, v in data.items()}
        if isinstance(data, list):
            return [self.obj(v) for v in data]
        return data
