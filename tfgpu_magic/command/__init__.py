"""The command language of ``%gpu``: its grammar, sizes and units, and the plan a request
resolves to.  Pure Python: imports nothing outside the standard library."""
