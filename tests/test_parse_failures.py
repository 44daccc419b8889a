"""Failure reasons, and the false alarms that must not become failures."""

from __future__ import annotations

import pytest

from eaglelab.parse.failures import FailureRecognizer, classify
from eaglelab.parse.state import LogState, combine_with_exit
from eaglelab.tail.whole import parse_bytes


def state_of(text: str) -> dict:
    return parse_bytes(text.encode())


# One row per reason: a line as the real tools print it.
@pytest.mark.parametrize("line,reason", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total capacity of 23.69 GiB", "cuda_oom"),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.63 GiB (GPU 0; 44.56 GiB total capacity)", "cuda_oom"),
    ("RuntimeError: CUDA error: out of memory", "cuda_oom"),
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.", "cuda_oom"),
    ("Killed", "host_oom_killed"),
    ("./train.sh: line 12: 48213 Killed                  python train.py", "host_oom_killed"),
    ("  exitcode  : -9 (pid: 3309)", "host_oom_killed"),
    ("  traceback : Signal 9 (SIGKILL) received by PID 3309", "host_oom_killed"),
    ("[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.", "nccl_error"),
    ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled system error", "nccl_error"),
    ("OSError: [Errno 28] No space left on device", "disk_full"),
    ('safetensors_rust.SafetensorError: Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })', "disk_full"),
    ("ModuleNotFoundError: No module named 'speculators'", "import_error"),
    ("ImportError: libc10_cuda.so: cannot open shared object file: No such file or directory", "import_error"),
    ("TimeoutError: Timed out waiting for the engine to start", "timeout"),
    ("httpx.ReadTimeout: timed out", "timeout"),
    ("ValueError: --draft-vocab-size 40000 exceeds the target vocab", "python_exception"),
    ("RuntimeError: CUDA error: device-side assert triggered", "python_exception"),
    ("jobwrap: cannot start 'speculators' in '/srv': [Errno 2] No such file or directory: 'speculators'", "other"),
    ("Segmentation fault (core dumped)", "other"),
    ("Fatal Python error: Aborted", "other"),
])
def test_each_reason(line, reason):
    s = state_of(f"starting\n{line}\n")
    assert s["state"] == "failed"
    assert s["failure"]["reason"] == reason
    assert s["failure"]["line"] == 2


def test_a_traceback_gives_its_exception_line_and_reason():
    log = ("INFO 01-01 10:00:00 [x.py:1] loading\n"
           "Traceback (most recent call last):\n"
           '  File "/srv/run.py", line 9, in <module>\n'
           "    raise ChildFailedError(\n"
           "           ^^^^^^^^^^^^^^^\n"
           "RuntimeError: shape mismatch: d2t has 32000 rows, draft vocab is 16000\n")
    s = state_of(log)
    assert s["failure"] == {"reason": "python_exception", "line": 6, "process": None,
                            "message": "RuntimeError: shape mismatch: d2t has 32000 rows, draft vocab is 16000"}


def test_the_root_cause_wins_over_what_it_caused():
    log = ("(Worker_TP1 pid=9) ERROR 05-08 14:46:12 [multiproc_executor.py:435] torch.OutOfMemoryError: CUDA out of memory.\n"
           "(EngineCore_DP0 pid=5) ERROR 05-08 14:46:13 [core.py:700] RuntimeError: Worker failed with error 'CUDA out', please check the stack trace above for the root cause\n"
           "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
    s = state_of(log)
    assert s["failure"]["reason"] == "cuda_oom" and s["failure"]["process"] == "(Worker_TP1 pid=9)"


# ---- false alarms ---------------------------------------------------------------------------

def test_warnings_never_fail_a_run():
    log = ("WARNING 06-13 11:42:20 _custom_ops.py:11] Failed to import from vllm._C with ImportError('x.so: undefined symbol: y')\n"
           "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 4041 closing signal SIGTERM\n"
           "2025-03-08 01:16:12,361 - openai._base_client - INFO - Retrying request to /chat/completions in 0.38 seconds\n"
           "[12:01:02] WARNING  Skipping sample 17 due to error: ReadTimeout('timed out')   generate_offline_data.py:179\n")
    s = state_of(log)
    assert s["state"] == "running" and s["failure"] is None


def test_sigterm_received_then_the_run_succeeds():
    log = ("Generating responses:  50%|#####     | 5/10 [00:05<00:05,  1.00it/s]\n"
           "WARNING 01-01 10:00:05 [launcher.py:80] SIGTERM received, shutting down the old server\n"
           "Generating responses: 100%|##########| 10/10 [00:10<00:00,  1.00it/s]\n"
           "\nPipeline complete in 10.2s: 10 conversations (10 ok, 0 errors, 0 truncated)\n")
    s = state_of(log)
    assert s["state"] == "completed" and s["failure"] is None
    assert s["metrics"]["regen/conversations_ok"] == [[0, 10.0]]


def test_a_caught_and_logged_traceback_then_progress_is_survived():
    log = ("Generating responses:  10%|#         | 1/10 [00:01<00:09,  1.00it/s]\n"
           "ERROR 01-01 10:00:01 [script.py:99] request 7 failed, will retry\n"
           "Traceback (most recent call last):\n"
           '  File "script.py", line 90, in call\n'
           "openai.APIConnectionError: Connection error.\n"
           "Generating responses:  20%|##        | 2/10 [00:02<00:08,  1.00it/s]\n")
    s = state_of(log)
    assert s["state"] == "running" and s["failure"] is None and s["failures_survived"] == 1


def test_a_traceback_after_the_last_progress_is_a_failure():
    log = ("Generating responses:  20%|##        | 2/10 [00:02<00:08,  1.00it/s]\n"
           "Traceback (most recent call last):\n"
           '  File "script.py", line 90, in call\n'
           "openai.APIConnectionError: Connection error.\n")
    assert state_of(log)["failure"]["reason"] == "python_exception"


def test_progress_of_another_process_does_not_excuse_a_dead_worker():
    log = ("(VllmWorker rank=1 pid=2) ERROR 05-08 14:46:12 [x.py:1] torch.OutOfMemoryError: CUDA out of memory.\n"
           "(VllmWorker rank=0 pid=1) Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01, 1.0s/it]\n")
    assert state_of(log)["failure"]["reason"] == "cuda_oom"


def test_a_failure_after_the_end_marker_still_fails():
    log = "Training epoch 2/2 completed\nOSError: [Errno 28] No space left on device\n"
    assert state_of(log)["state"] == "failed"


def test_code_lines_inside_a_traceback_are_not_failures():
    r = FailureRecognizer()
    assert r.feed("", None, "Traceback (most recent call last):", 1) is None
    assert r.feed("", None, '  File "oom.py", line 3, in <module>', 2) is None
    assert r.feed("", None, "    raise torch.OutOfMemoryError('CUDA out of memory')", 3) is None
    c = r.feed("", None, "KeyError: 'model'", 4)
    assert (c.reason, c.line) == ("python_exception", 4)


def test_classify_has_no_opinion_on_ordinary_text():
    for text in ("Loading weights took 2.1 seconds", "epoch=0 loss=1.2", "Error rate: 0.1 (fine)", "Killed time reading"):
        assert classify(text) is None


# ---- exit status ------------------------------------------------------------------------------

@pytest.mark.parametrize("exit_info,state,reason", [
    ({"exit_code": 0, "signal": None}, "completed", None),
    ({"exit_code": None, "signal": 9, "signal_name": "SIGKILL"}, "failed", "host_oom_killed"),
    ({"exit_code": 137, "signal": None}, "failed", "host_oom_killed"),
    ({"exit_code": None, "signal": 15, "signal_name": "SIGTERM"}, "killed", None),
    ({"exit_code": None, "signal": 9, "signal_name": "SIGKILL", "stop_requested": True}, "killed", None),
    ({"exit_code": 124, "signal": None}, "failed", "timeout"),
    ({"exit_code": 3, "signal": None}, "failed", "other"),
])
def test_exit_status_decides_a_log_without_a_reason(exit_info, state, reason):
    st = LogState()
    st.feed_line("working", 1)
    s = st.snapshot(exit_info=exit_info)
    assert s["state"] == state and (s["failure"] or {}).get("reason") == reason
    assert s["exit"]["exit_code"] == exit_info["exit_code"]


def test_exit_code_keeps_the_reason_the_log_gave():
    s = combine_with_exit(state_of("OSError: [Errno 28] No space left on device\n"), {"exit_code": 1, "signal": None})
    assert s["state"] == "failed" and s["failure"]["reason"] == "disk_full"
    ok = combine_with_exit(state_of("ERROR 01-01 10:00:00 [x.py:1] ValueError: caught\n"), {"exit_code": 0, "signal": None})
    assert ok["state"] == "completed" and ok["failure"] is None
