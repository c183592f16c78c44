# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus text exposition (format 0.0.4) for node-exporter's textfile collector.

Shared by the kunlun-fleet exporters installed next to it (kunlun-xpu-exporter,
kunlun-gateway-exporter). Standard library only, Python 3.5+.

node-exporter reads every ``*.prom`` file of its textfile directory at each scrape. A file
read while it is being written would give Prometheus a half-written set of samples (or a
parse error that drops the whole file), so ``write_atomic`` writes a temporary file in the
same directory (same filesystem: the rename is atomic), whose name does not end in
``.prom`` (the collector skips it), syncs it to disk and renames it over the target.
"""

import math
import os
import tempfile


def escape_label_value(value):
    """A label value as the exposition format quotes it: backslash, double quote, newline."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text):
    """HELP text: backslash and newline are escaped, quotes are not."""
    return str(text).replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value):
    """A sample value: integers without a decimal point, floats in full, NaN and infinities
    as the format spells them."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


class Exposition:
    """Metric families in the order they were declared, each with its HELP and TYPE line
    once, followed by its samples. A family without samples is left out."""

    def __init__(self, families):
        # families: iterable of (name, type, help)
        self._families = list(families)
        self._known = set(name for name, _kind, _text in self._families)
        self._samples = dict((name, []) for name in self._known)

    def add(self, name, value, labels=None):
        """One sample; labels whose value is None or '' are left out (unknown)."""
        if name not in self._known:
            raise KeyError("metric %s is not declared" % name)
        pairs = sorted((k, v) for k, v in (labels or {}).items() if v is not None and v != "")
        self._samples[name].append((pairs, value))

    def names(self):
        """The names of the families that have samples."""
        return [name for name, _kind, _text in self._families if self._samples[name]]

    def render(self):
        out = []
        for name, kind, text in self._families:
            samples = self._samples[name]
            if not samples:
                continue
            out.append("# HELP %s %s" % (name, escape_help(text)))
            out.append("# TYPE %s %s" % (name, kind))
            for pairs, value in samples:
                labels = ",".join('%s="%s"' % (k, escape_label_value(v)) for k, v in pairs)
                out.append("%s%s %s" % (name, "{%s}" % labels if labels else "", format_value(value)))
        return "\n".join(out) + "\n"


def write_atomic(path, text, mode=0o644):
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never a
    part: a temporary file in the same directory, fsync, rename, fsync of the directory."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".%s." % os.path.basename(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates 0600; node-exporter runs as another user and must read it.
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
