"""The contention manifest: the recorder's mergeable data, its evaluation (verdict, hot locks,
starvation, pool size), its file format (canonical JSON with a digest), admission checks for a
successor pool, and merging across processes.

It reads ``record``'s snapshot and histograms; it never touches locks or OpenTelemetry.
"""
