"""What runs in the user's kernel: the session (the request and what was applied), the
``%gpu`` magics, cells, trace, the out-of-memory explanation, status and the memory panel."""
