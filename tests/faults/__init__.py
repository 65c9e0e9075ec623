"""The fault-injection suite (issue 15): each test injects one fault into a real run (a full disk, a
damaged part, SIGTERM and Ctrl-C, a hung or killed answer-check worker, a misbehaving OpenAI-compatible
server, an input changed between a kill and its rerun), lets stepkit recover or refuse, and measures the
rows lost (rows of the input missing from the final output after the rerun, by id), which must be 0.
``README.md`` beside this file has the table of faults with the figures measured here."""
