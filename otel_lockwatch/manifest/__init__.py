"""The contention manifest: what a pool ran under, for its successor to read.

It reads ``record``'s data (the recorder's snapshot, or manifests' data parts) and never touches
locks or OpenTelemetry. One module per idea:

- ``_data``: checking a data part and copying it into the form the others work on;
- ``_evaluate``: the derived fields (verdict, hot locks, starvation, pool and section sizes);
- ``_pools``: hand-off waits (a checkout waiting for a connection, a consumer waiting for work):
  their fields, contention or idle, the resource pools and what their capacity supports;
- ``_distributed``: distributed locks' fields (key templates, leases, release failures) and the
  lease overruns that make the verdict ``LEASE_OVERRUN_DETECTED``;
- ``_model``: the ``Manifest`` object, its verdict, canonical JSON and digest;
- ``_io``: the file (atomic write with the umask's mode; a reader that refuses anything it
  cannot trust: special files, oversized files, malformed or ambiguous JSON);
- ``_check``: a document checked (schema, digest, data) and its derived fields evaluated again;
- ``_admission``: the successor's check of its pool size against a manifest;
- ``_merge``: the manifests of several processes merged into one.
"""
