"""The harness that tests, the demo and the benchmarks share; not the library's API.

Random-weight models built locally (``models``) with an offline tokenizer
(``tokenizer``), scripted vLLM engines run in a child process (``engine``, ``runner``),
CPU seconds by role (``cpu_times``) and a throwaway redis-server (``redis_server``). The
library never imports this package.
"""
