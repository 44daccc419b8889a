"""Failure reasons, and the false alarms that must not become failures."""

from __future__ import annotations

import pytest

from eaglelab.host.parse.failures import FailureRecognizer, classify
from eaglelab.host.parse.state import LogState, combine_with_exit
from eaglelab.host.tail.whole import parse_bytes


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
    ("RuntimeError: CUDA error: device-side assert triggered", "cuda_error"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda_error"),
    ("RuntimeError: cuda runtime error (2) : out of memory at /pytorch/THC/THCStorage.cu:66", "cuda_oom"),
    ("requests.exceptions.ReadTimeout: (ReadTimeoutError(\"HTTPSConnectionPool(host='hf.co', port=443): Read timed out.\"))", "timeout"),
    ("jobwrap: cannot start 'speculators' in '/srv': [Errno 2] No such file or directory: 'speculators'", "other"),
    ("Segmentation fault (core dumped)", "other"),
    ("Fatal Python error: Aborted", "other"),
])
def test_each_reason(line, reason):
    s = state_of(f"starting\n{line}\n")
    assert s["state"] == "failed"
    assert s["failure"]["reason"] == reason
    assert s["failure"]["line"] == 2


# Classes of misses seen on public logs (issue #15): each a shape, not an example.
def test_a_cpp_abort_is_a_failure_named_by_its_what_line():
    log = ("Epoch 0:   3%|3         | 1/29 [00:23<11:10, 23.93s/it]\n"
           "terminate called after throwing an instance of 'c10::CUDAError'\n"
           "  what():  CUDA error: device-side assert triggered\n"
           "Exception raised from createEvent at ../aten/src/ATen/cuda/CUDAEvent.h:166 (most recent call first):\n"
           "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x42 (0x7fc7 in libc10.so)\n")
    s = state_of(log)
    assert s["state"] == "failed" and s["failure"]["reason"] == "cuda_error" and s["failure"]["line"] == 2


def test_a_worker_error_line_naming_the_cause_before_its_traceback():
    log = ("(VllmWorkerProcess pid=232) ERROR 08-23 08:25:25 multiproc_worker_utils.py:226] Exception in worker "
           "VllmWorkerProcess while processing method init_device: NCCL error: unhandled system error (run with "
           "NCCL_DEBUG=INFO for details), Traceback (most recent call last):\n"
           '(VllmWorkerProcess pid=232) ERROR 08-23 08:25:25 multiproc_worker_utils.py:226]   File "/w.py", line 223, in run\n'
           "(VllmWorkerProcess pid=232) ERROR 08-23 08:25:25 multiproc_worker_utils.py:226]     output = executor()\n")
    s = state_of(log)
    assert s["state"] == "failed" and s["failure"]["reason"] == "nccl_error" and s["failure"]["line"] == 1


@pytest.mark.parametrize("line,reason", [
    ("(VllmWorkerProcess pid=232) ERROR 08-23 08:25:25 multiproc_worker_utils.py:226] Exception in worker "
     "VllmWorkerProcess while processing method init_device: NCCL error: unhandled system error (run with "
     "NCCL_DEBUG=INFO for details)", "nccl_error"),
    ("(VllmWorker rank=1 pid=2) ERROR 05-08 14:46:12 [multiproc_executor.py:1] WorkerProc failed to start: "
     "CUDA error: an illegal memory access was encountered", "cuda_error"),
    ("[rank3]:[E429 13:55:49.384372190 ProcessGroupNCCL.cpp:1743] [PG 0 Rank 3] Process group watchdog thread "
     "terminated with exception: NCCL error: unhandled system error", "nccl_error"),
])
def test_a_fatal_error_level_worker_line_without_a_traceback_is_a_failure(line, reason):
    # The worker's only word on it: no traceback, no exception line; the server process says less still.
    log = ("(APIServer pid=1) INFO 08-23 08:25:20 [api_server.py:1] vLLM API server version 0.5.4\n"
           f"{line}\n"
           "(APIServer pid=1) INFO 08-23 08:25:26 [multiproc_worker_utils.py:1] Killing local vLLM worker processes\n")
    s = state_of(log)
    assert s["state"] == "failed" and s["failure"]["reason"] == reason and s["failure"]["line"] == 2


@pytest.mark.parametrize("first", ["Traceback (most recent call last):", '  File "/srv/a.py", line 3, in <module>'])
def test_a_finished_log_that_ends_inside_a_traceback_failed(first):
    log = ("Epoch 10:   0%|          | 0/5878 [00:00<?, ?it/s]\n"
           f"{first}\n"
           '  File "/srv/train.py", line 112, in train\n'
           "    trainer.fit(model)\n")
    s = state_of(log)
    assert s["state"] == "failed" and s["failure"]["reason"] == "python_exception" and s["failure"]["line"] == 2
    live = LogState()  # a live tail that has not seen the end is not told the run failed
    for i, line in enumerate(log.splitlines(), 1):
        live.feed_line(line, i, now=1000.0 + i)
    assert live.snapshot(now=1010.0, alive=True)["state"] == "running"


def test_a_workflow_engines_prefix_does_not_hide_a_traceback():
    pre = "2023-04-29 06:01:12.977 [177/train/578 (pid 28936)] [09c561ee-a44c-4795-967c-7183a83b3160] "
    log = (f"{pre}2023-04-29 06:01:12 ERROR [__main__] main failed\n"
           f"{pre}Traceback (most recent call last):\n"
           f'{pre}  File "/opt/conda/lib/python3.7/site-packages/torch/serialization.py", line 379, in save\n'
           f"{pre}    _save(obj, opened_zipfile, pickle_module, pickle_protocol)\n"
           f"{pre}OSError: [Errno 28] No space left on device\n")
    s = state_of(log)
    assert s["state"] == "failed" and s["failure"]["reason"] == "disk_full" and s["failure"]["line"] == 5


def test_a_retried_timeout_warning_is_not_a_failure_but_a_raised_one_is():
    retried = ("'(ReadTimeoutError(\"HTTPSConnectionPool(host='huggingface.co', port=443): Read timed out. "
               "(read timeout=10)\"), '(Request ID: 7d76)')' thrown while requesting HEAD https://huggingface.co/x\n")
    assert state_of(retried)["state"] != "failed"
    raised = "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='hf.co', port=443): Read timed out.\n"
    assert state_of(raised)["failure"]["reason"] == "timeout"


def test_a_bar_redrawn_after_the_error_does_not_survive_it():
    log = ("requests.exceptions.ConnectionError: HTTPSConnectionPool(host='cdn', port=443): Read timed out.\n"
           "Downloading (…)l-00001-of-00003.bin:  48%|####8     | 4.70G/9.88G [00:22<03:06, 27.8MB/s]\n")
    assert state_of(log)["state"] == "failed"


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
