"""One adapter per signal source. Adapters only gather: every failure becomes `{"error": ...}`.

Per-notebook probes (jupyter, codeserver) share the bounded fetch in `http`; the bulk sources (gpu,
dcgm, rstudio: one query for many pods per pass) share the `bulk.BulkSource` interface.
"""
