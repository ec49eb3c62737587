"""Helpers and fixtures of the tests first written in tests/test_host_check.py (The host-side check:
every bank is hostile input (X2, SECURITY.md).), shared by the rule tests filed by family in
tests/rules/ and by the tests that stayed."""

from __future__ import annotations

from scratchbank.application.bank_format.gunzip import GzipReader
from scratchbank.application.bank_format.reader import Limits, TarReader


def check(data: bytes, limits: Limits = Limits()) -> TarReader:
    reader = TarReader(limits)
    gunzip = GzipReader(reader.feed, limits.uncompressed_bytes)
    for i in range(0, len(data), 999):
        gunzip.feed(data[i : i + 999])
    gunzip.close()
    reader.close()
    return reader
