"""Stages: pure logic over rows and an engine. I/O, resume and progress live in :mod:`stepkit.runner`."""
