"""A hidden-states KV connector for vLLM on a machine without a GPU.

vLLM's stock `ExampleHiddenStatesConnector` (used with the `extract_hidden_states` speculative
method) copies the hidden states device->host through pinned memory on a CUDA stream and writes
them from a thread pool; on CPU that fails (`pin_memory=True requires a CUDA or other accelerator
backend`). This subclass does the same extraction synchronously: slice the cache, save the file,
release the lock. Everything else (scheduler side, lock protocol, file names) is the parent's, so
`speculators generate-offline-data` reads its files unchanged.

Loaded by vLLM through the kv transfer config:
  {"kv_connector": "CpuHiddenStatesConnector",
   "kv_connector_module_path": "eaglelab.vllm_cpu_connector", "kv_role": "kv_producer",
   "kv_connector_extra_config": {"shared_storage_path": DIR}}
"""

from __future__ import annotations

import fcntl
import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _Done:
    """Stands for the parent's CUDA event: the copy is finished when we return."""

    def query(self) -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (offsets.reshape(1, -1) + block_ids.reshape(-1, 1) * self._block_size).flatten()
        hidden = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0])

        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            save_file({"hidden_states": hidden.clone().contiguous(),
                       "token_ids": pending.token_ids.clone()}, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases LOCK_EX: the client may read now
        self._req_copy_events[pending.req_id] = _Done()
