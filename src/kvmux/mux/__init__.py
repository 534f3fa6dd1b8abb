"""MuxConnector's halves without vLLM: scheduler bookkeeping, worker step state, guards."""
