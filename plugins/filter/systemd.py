# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A value as one word of a systemd command line (ExecStart= and the other Exec*= settings of
the units the roles write), so that systemd hands the program exactly that value: never split
at a space, never expanded as a specifier (%n, ...) or an environment variable ($HOME, ${X});
with command=false, one word of another setting that takes quoted words and specifiers but no
variables (RequiresMountsFor=). Documentation: systemd_quote.yml.

The rules (systemd.service(5) "Command lines", systemd.syntax(7) "Quoting", systemd.unit(5)
"Specifiers"): "%%" is a literal "%" and "$$" a literal "$", in quotes or not; a word with a
space, a quote, a backslash or a control character, an empty word and a lone ";" (the
separator of two command lines) are written in double quotes, inside which a backslash and a
double quote are escaped and control characters written as C escapes. A NUL cannot be an
argument at all.
"""

from __future__ import absolute_import, division, print_function

import re

__metaclass__ = type

# Written as they are, outside quotes (after % and $ are doubled).
_PLAIN = re.compile(r"^[^\s\"'\\;\x00-\x1f\x7f]+$")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _char(c):
    if c in _ESCAPES:
        return _ESCAPES[c]
    if ord(c) < 0x20 or ord(c) == 0x7F:
        return "\\x%02x" % ord(c)
    return c


def _word(value, command):
    text = value if isinstance(value, str) else str(value)
    if "\x00" in text:
        raise ValueError("systemd_quote: %r holds a NUL character, which no command-line argument can" % text)
    text = text.replace("%", "%%")
    if command:  # only command lines expand $VARIABLES
        text = text.replace("$", "$$")
    if _PLAIN.match(text):
        return text
    return '"%s"' % "".join(_char(c) for c in text)


def systemd_quote(value, command=True):
    """One word of a systemd command line for a value (of another setting's list of words with
    command=false); for a list, one word per item."""
    if isinstance(value, (list, tuple)):
        return [_word(v, command) for v in value]
    return _word(value, command)


class FilterModule:
    def filters(self):
        return {"systemd_quote": systemd_quote}
