"""Striped sections: a fixed array of locks indexed by FNV-1a of an entity key.

The lowest layer: it imports nothing else of the package but ``exceptions``. The instrumentation
(``capture``) replaces two methods of each array class; the arrays work the same without it.
"""
