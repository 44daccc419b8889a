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
    ("RuntimeError: CUDA error: device-side assert triggered", "cuda_assert"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda_error"),
    ("RuntimeError: cuda runtime error (2) : out of memory at /pytorch/THC/THCStorage.cu:66", "cuda_oom"),
    ("requests.exceptions.ReadTimeout: (ReadTimeoutError(\"HTTPSConnectionPool(host='hf.co', port=443): Read timed out.\"))", "timeout"),
    ("jobwrap: cannot start 'speculators' in '/srv': [Errno 2] No such file or directory: 'speculators'", "other"),
    ("Segmentation fault (core dumped)", "segfault"),
    ("Aborted (core dumped)", "other"),
    ("slurmstepd: error: *** JOB 1234567 ON gpu-a12 CANCELLED AT 2025-03-01T12:00:03 DUE TO TIME LIMIT ***", "time_limit"),
    ("[2026-01-29T04:03:03.675] error: *** JOB 23859577 ON gpu-110 CANCELLED AT 2026-01-29T04:03:03 DUE to SIGNAL Terminated ***", "signal"),
    ("slurmstepd: error: *** JOB 42 ON n1 CANCELLED AT 2025-03-01T12:00:03 ***", "killed"),  # scancel
    ("slurmstepd: error: *** STEP 42.0 ON n1 CANCELLED AT 2025-03-01T12:00:03 DUE TO PREEMPTION ***", "killed"),
    ("/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1289: indexSelectLargeIndex: block: [194,0,0], thread: [96,0,0] "
     "Assertion `srcIndex < srcSelectDimSize` failed.", "cuda_assert"),
    ("torch.distributed.elastic.multiprocessing.api.SignalException: Process 2118 got signal: 15", "signal"),
    ("  exitcode  : -11 (pid: 7)", "segfault"),
    ("  exitcode  : -15 (pid: 7)", "signal"),
    ("Fatal Python error: Segmentation fault", "segfault"),
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
    assert s["state"] == "failed" and s["failure"]["reason"] == "cuda_assert" and s["failure"]["line"] == 3  # the what(): line names the assert


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


_SERVING = ("(APIServer pid=7) INFO:     Application startup complete.\n"
            "(APIServer pid=7) INFO 04-27 15:11:14 [loggers.py:236] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
            "Avg generation throughput: 7.5 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%\n")
_SHUTDOWN = ("(APIServer pid=7) INFO:     Shutting down\n"
             "(APIServer pid=7) INFO:     Waiting for application shutdown.\n"
             "(APIServer pid=7) INFO:     Application shutdown complete.\n"
             "(APIServer pid=7) INFO:     Finished server process [7]\n")
_ENGINE_DIED = ("(APIServer pid=7) ERROR 04-27 18:09:47 [core_client.py:600] Engine core proc EngineCore_DP0 died "
                "unexpectedly, shutting down client.\n"
                "(APIServer pid=7) ERROR 04-27 18:09:47 [async_llm.py:546] Traceback (most recent call last):\n"
                '(APIServer pid=7) ERROR 04-27 18:09:47 [async_llm.py:546]   File "async_llm.py", line 498, in output_handler\n'
                "(APIServer pid=7) ERROR 04-27 18:09:47 [async_llm.py:546] vllm.v1.engine.exceptions.EngineDeadError: "
                "EngineCore encountered an issue. See stack trace (above) for the root cause.\n")


def test_a_server_that_shuts_down_after_its_engine_died_failed():
    # the shutdown follows from the error: it is not the process going on (it was read `completed`)
    s = state_of(_SERVING + _ENGINE_DIED + _SHUTDOWN)
    assert s["state"] == "failed" and "EngineDeadError" in s["failure"]["message"]


def test_a_server_that_served_on_after_an_error_then_shut_down_completed():
    s = state_of(_SERVING + _ENGINE_DIED + _SERVING.splitlines(keepends=True)[1] + _SHUTDOWN)
    assert s["state"] == "completed" and s["failure"] is None and s["failures_survived"] == 1


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


# The ending classes of issue #33: each the exact reason it should get.
def test_a_time_limit_glued_to_the_last_frame_is_the_time_limit_not_the_sigterm_after_it():
    log = ("Training:  41%|####1     | 410/1000 [3:59:58<5:45:12, 35.12s/it]slurmstepd: error: *** JOB 4242 ON "
           "gpu-a7 CANCELLED AT 2025-05-02T03:00:01 DUE TO TIME LIMIT ***\n"
           "torch.distributed.elastic.multiprocessing.api.SignalException: Process 51 got signal: 15\n")
    s = state_of(log)
    assert s["state"] == "failed" and s["failure"]["reason"] == "time_limit" and s["failure"]["line"] == 1
    assert s["progress"]["n"] == 410 and s["progress"]["total"] == 1000


def test_a_device_side_assert_inside_an_nccl_error_is_the_assert():
    log = ("[rank3]:[E502 11:02:03.1 ProcessGroupNCCL.cpp:1515] [PG 0 Rank 3] Process group watchdog thread "
           "terminated with exception: CUDA error: an illegal memory access was encountered\n"
           "../aten/src/ATen/native/cuda/ScatterGatherKernel.cu:144: operator(): block: [0,0,0], thread: [5,0,0] "
           "Assertion `idx_dim >= 0 && idx_dim < index_size && \"index out of bounds\"` failed.\n"
           "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error\n")
    s = state_of(log)
    assert s["failure"]["reason"] == "cuda_assert" and s["failure"]["line"] == 2


def test_sigterm_and_sigsegv_deaths_are_not_python_exceptions():
    sigterm = ("Traceback (most recent call last):\n  File \"/x/run.py\", line 3, in <module>\n    main()\n"
               "torch.distributed.elastic.multiprocessing.api.SignalException: Process 2118 got signal: 15\n")
    assert state_of(sigterm)["failure"]["reason"] == "signal"
    segv = ("[1]:\n  time      : 2024-01-01_00:00:00\n  rank      : 1 (local_rank: 1)\n"
            "  exitcode  : -11 (pid: 412)\n  error_file: <N/A>\n  traceback : Signal 11 (SIGSEGV) received by PID 412\n")
    assert state_of(segv)["failure"]["reason"] == "segfault"


def test_a_kill_reported_at_info_ends_the_run_unless_it_goes_on():
    killed = ("Processed prompts:  40%|####      | 40/100 [00:40<01:00,  1.00it/s]\n"
              "INFO 05-02 10:00:41 [launcher.py:12] Received SIGTERM, shutting down\n")
    s = state_of(killed)
    assert s["state"] == "failed" and s["failure"]["reason"] == "killed" and s["failure"]["line"] == 2
    went_on = killed + "Processed prompts: 100%|##########| 100/100 [01:40<00:00,  1.00it/s]\n"
    assert state_of(went_on)["failure"] is None


def test_a_torchrun_summary_alone_is_a_failure():
    log = ("Root Cause (first observed failure):\n[0]:\n  time      : 2023-08-08_23:35:37\n"
           "  exitcode  : 1 (pid: 429)\n  error_file: <N/A>\n")
    s = state_of(log)
    assert s["state"] == "failed" and s["failure"]["reason"] == "python_exception" and s["failure"]["line"] == 4


def test_a_child_traceback_relayed_at_info_is_followed():
    log = ("2025-06-27 12:57:51,690 - __main__ - INFO - starting the engine\n"
           '2025-06-27 12:57:51,690 - __main__ - INFO -   File "/x/utils.py", line 494, in wait_for_engine_startup\n'
           '2025-06-27 12:57:51,690 - __main__ - INFO -     raise RuntimeError("Engine core initialization failed.")\n'
           "2025-06-27 12:57:51,690 - __main__ - INFO - RuntimeError: Engine core initialization failed.\n")
    s = state_of(log)
    assert s["state"] == "failed" and s["failure"]["reason"] == "python_exception" and s["failure"]["line"] == 4


def test_frames_cut_at_the_terminal_width_keep_their_progress():
    frame = "Loading checkpoint shards:  {p:2d}%|{bar:<40}| {n}/96 [{m:02d}:{s:02d}"
    line = "".join(frame.format(p=100 * n // 96, bar="#" * (40 * n // 96), n=n, m=(25 * n) // 60, s=(25 * n) % 60)
                   for n in range(37, 46))
    s = state_of(line + "\n")
    p = s["progress"]
    assert (p["label"], p["n"], p["total"], p["elapsed_s"]) == ("Loading checkpoint shards", 45, 96, 1125.0)
    assert p["eta_s"] is not None and 0.5 * 51 * 25 < p["eta_s"] < 2 * 51 * 25  # the rate, from the frames' elapsed
    cut80 = "Training:  12%|#2        | 120/1000 [01:00<07:20,  2.00it/s, loss=0.4"  # cut in the postfix
    p = state_of(cut80 + "\n")["progress"]
    assert (p["n"], p["total"]) == (120, 1000)


def test_a_unit_after_a_space_is_a_bar():
    p = state_of("Generating train split: 68 examples [01:54,  1.58s/ examples]\n")["progress"]
    assert (p["label"], p["n"], p["total"], p["elapsed_s"]) == ("Generating train split", 68, None, 114.0)
    assert p["rate_s_per_it"] == 1.58 and p["unit"] == "examples"


@pytest.mark.parametrize("job_line,reason", [
    ("[1]+  Killed                  python train.py", "host_oom_killed"),       # bash's job table
    ("[1]    26478 killed     python test.py", "host_oom_killed"),              # zsh's
    ("zsh: killed     python test.py", "host_oom_killed"),
    ("[2]  - 1234 segmentation fault  python infer.py", "segfault"),
    ("zsh: segmentation fault  python infer.py", "segfault"),
])
def test_a_shells_job_line_for_its_dead_child_is_the_reason(job_line, reason):
    alone = state_of(f"starting\n{job_line}\n")
    assert alone["state"] == "failed" and alone["failure"]["reason"] == reason
    # zsh prints it where the cursor was: after the last frame of a bar, with no newline between
    glued = state_of("Loading checkpoint shards:   0%|          | 0/3 [00:00<?, ?it/s]" + job_line + "\n")
    assert glued["state"] == "failed" and glued["failure"]["reason"] == reason
    assert (glued["progress"]["n"], glued["progress"]["total"]) == (0, 3)


def test_text_that_only_mentions_a_kill_is_not_a_job_line():
    for text in ("see [1] killed by default", "the [3] process was killed", "[12] done python x.py"):
        assert state_of(f"starting\n{text}\n")["failure"] is None, text


BAR_TO_2_OF_4 = ("Loading checkpoint shards:  25%|##5       | 1/4 [00:05<00:15,  5.00s/it]\r"
                 "Loading checkpoint shards:  50%|#####     | 2/4 [00:10<00:10,  5.00s/it]")


@pytest.mark.parametrize("pause", ["Press any key to continue . . .", "请按任意键继续. . ."])
@pytest.mark.parametrize("glued", [True, False])
def test_a_wrappers_pause_prompt_after_a_bar_left_part_way_is_a_silent_death(pause, glued):
    log = BAR_TO_2_OF_4 + ("" if glued else "\n") + pause + "\n"
    s = state_of(log)
    assert s["state"] == "failed" and s["failure"]["reason"] == "lost"
    assert "2/4 of 'Loading checkpoint shards'" in s["failure"]["message"] and pause in s["failure"]["message"]
    assert (s["progress"]["n"], s["progress"]["total"]) == (2, 4)


def test_a_wrappers_pause_prompt_after_the_work_is_done_or_a_named_failure_changes_nothing():
    done = BAR_TO_2_OF_4 + "\rLoading checkpoint shards: 100%|##########| 4/4 [00:20<00:00,  5.00s/it]\n"
    assert state_of(done + "Press any key to continue . . .\n")["failure"] is None
    oom = BAR_TO_2_OF_4 + "\ntorch.OutOfMemoryError: CUDA out of memory.\nPress any key to continue . . .\n"
    assert state_of(oom)["failure"]["reason"] == "cuda_oom"
    # a bar that starts after the prompt (the wrapper ran the program again) is not the one that died
    again = "Press any key to continue . . .\n" + BAR_TO_2_OF_4 + "\n"
    assert state_of(again)["failure"] is None


_UVICORN_BIND_FAILED = ("INFO:     Started server process [1115798]\n"
                        "INFO:     Waiting for application startup.\n"
                        "INFO:     Application startup complete.\n"
                        "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 23335): "
                        "address already in use\n"
                        "INFO:     Waiting for application shutdown.\n"
                        "INFO:     Application shutdown complete.\n")


def test_a_server_that_could_not_bind_its_port_failed_despite_its_clean_shutdown():
    # uvicorn exits 1 after it (bench/corpus/public/rap-lmdeploy-tp4-turbomind-convert-28-bind-error.log);
    # it was read `completed`, its shutdown lines being the end marker
    s = state_of(_UVICORN_BIND_FAILED)
    assert s["state"] == "failed" and s["failure"]["reason"] == "other"
    assert "address already in use" in s["failure"]["message"]


def test_a_bind_error_that_progress_follows_is_survived():
    # the same server's error, then the job's own work goes on to its end (the evaluation used another server)
    bar = "".join(f"\r{k}/7 [00:{k:02d}<00:{7 - k:02d},  1.00s/it]" for k in range(8)) + "\n"
    s = state_of(_UVICORN_BIND_FAILED + bar)
    assert s["failure"] is None and s["failures_survived"] == 1
