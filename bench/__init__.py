"""The benchmarks a user runs: captioning and training speed, memory, caption quality, the decoder protocol, encoder
backends and the app's round trip. Each module runs from the repository root as ``python -m bench.<name>``
(``make bench`` runs ``python -m bench.run_all``); bench/README.md lists them."""
