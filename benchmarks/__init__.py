"""The benchmark suite: ``python benchmarks/run.py`` measures, ``benchmarks/report.py`` writes
``benchmarks/RESULTS.md``. See DESIGN.md section 5."""
