"""Benchmarks of kvmux against the raw limits of the hardware and services it runs on."""
