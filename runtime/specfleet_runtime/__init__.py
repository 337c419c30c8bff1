"""specfleet's data plane: what runs inside pods (router, engine emulator, vLLM command line)."""
