"""Every strategy x every feature, as a user runs them: distrain end to end, each run asserting
sane results (accuracy floors measured once and written here, resumed runs equal to
uninterrupted ones), not only an exit code.

Usage: scenario.py DISTRAIN JPEG_DIR WORKDIR [FILTER]
  JPEG_DIR: a JPEG folder (train/<class>/*.jpg, test/<class>/*.jpg) made by make_jpeg_mnist.
  FILTER:   run only the cases whose name contains it.

Strategies: one_device (cpu:0), mirrored (2 CPU replicas), multi_worker with 2 local worker
processes over TCP, and over shared memory, parameter_server with 2 workers and 1 ps,
central_storage (2 CPU replicas, the variables on cpu:0). Features: a validation split, BackupAndRestore
resume after SIGKILL (the resumed run's final weights equal the uninterrupted run's, byte for
byte: every CPU strategy is deterministic; also with EarlyStopping and ReduceLROnPlateau, whose
state must travel in the backup), EarlyStopping, ReduceLROnPlateau, mixed_bfloat16,
JPEG folder input, Fashion-MNIST, a global batch not divisible by the replicas,
--steps-per-epoch, and a Keras Functional model (--model). Runs are short (2 epochs of 30 steps unless a feature needs more); the
floors are ~0.1 below what each case measured on the 2-core AVX2 EPYC (3 December 2026,
printed in every line), so they catch a broken feature (chance is 0.10), not noise.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

STRATEGIES = {
    "one_device": ["--strategy", "one_device", "--devices", "cpu:0"],
    "mirrored": ["--strategy", "mirrored", "--devices", "cpu:0,cpu:1", "--threads", "1"],
    "mw_tcp": ["--strategy", "multi_worker", "--workers", "2", "--transport", "tcp"],
    "mw_shm": ["--strategy", "multi_worker", "--workers", "2", "--transport", "shm"],
    "ps": ["--strategy", "parameter_server", "--workers", "2", "--ps", "1"],
    "central_storage": ["--strategy", "central_storage", "--devices", "cpu:0,cpu:1", "--threads",
                        "1"],
}
# Not run, and why (printed): asynchronous updates are not bit-reproducible, so the resume
# cases' byte-for-byte check does not apply (distrain.ps_restart_resumes covers resuming);
# the data-source and batch cases already ran under four strategies through the same code.
SKIP = {
    "ps": {"resume_after_sigkill": "asynchronous updates: no byte-equal resume",
           "resume_with_callbacks": "asynchronous updates: no byte-equal resume",
           "fashion_mnist": "the data source is strategy-independent",
           "odd_global_batch": "each step is one worker's batch: nothing is split"},
}
SHORT = ["--epochs", "2", "--steps-per-epoch", "30"]
# feature: (extra flags, test-accuracy floor, extra check)
FEATURES = {
    "validation_split": (SHORT + ["--validation-split", "0.1"], 0.80, "val_accuracy"),
    "early_stopping": (["--epochs", "4", "--steps-per-epoch", "20", "--validation-split", "0.1",
                        "--early-stopping-patience", "1"], 0.80, None),
    "reduce_lr": (["--epochs", "3", "--steps-per-epoch", "20", "--validation-split", "0.1",
                   "--reduce-lr-patience", "0"], 0.80, None),
    "bf16": (SHORT + ["--mixed-precision", "bf16"], 0.80, None),
    "jpeg_folder": (SHORT + ["--data-format", "jpeg-folder"], 0.75, None),
    "fashion_mnist": (SHORT + ["--dataset", "fashion_mnist"], 0.55, None),
    "odd_global_batch": (SHORT + ["--batch-size", "63"], 0.80, None),
    "steps_per_epoch": (["--epochs", "1", "--steps-per-epoch", "45"], 0.80, "steps"),
    "resume_after_sigkill": (["--epochs", "3", "--steps-per-epoch", "20"], 0.80, "resume"),
    # the callbacks' state (best value, wait, learning rate, cooldown) travels in the backup
    # (at a learning rate of 0.005 val_loss worsens in epoch 5: the rate is cut and
    # EarlyStopping waits, and the run is killed right after that epoch's backup)
    "resume_with_callbacks": (["--epochs", "7", "--steps-per-epoch", "20", "--validation-split",
                               "0.1", "--early-stopping-patience", "2", "--reduce-lr-patience",
                               "0", "--learning-rate", "0.005"], 0.85, "resume"),
    # a Keras Functional model (tests/data/tf_keras_residual_mnist.json, written by tf_keras: a
    # residual block with BatchNormalization at momentum 0.9, an Add skip and a softmax head) in
    # place of the seed CNN: 0.86-0.88 under one_device over three seeds (2-core Xeon, 5 December
    # 2026); at Keras's default momentum 0.99 the moving statistics lag after 60 steps and the
    # accuracy swung 0.28-0.62 with the seed
    "keras_model": (SHORT + ["--model", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                     "..", "data", "tf_keras_residual_mnist.json")],
                    0.75, None),
}


# Floors of their own for asynchronous training (two workers, each on values up to a step old,
# each with its own data order): 45 steps measured 0.68-0.77 where synchronous strategies reach
# ~0.83; the 60-step cases 0.80-0.88 (3 December 2026), so ~0.1 below those.
FLOORS = {("ps", "steps_per_epoch"): 0.58, ("ps", "validation_split"): 0.70,
          ("ps", "early_stopping"): 0.70, ("ps", "reduce_lr"): 0.70, ("ps", "bf16"): 0.70,
          ("ps", "jpeg_folder"): 0.65,
          # the Functional model (BatchNormalization): 0.836-0.858 over 10 reruns, 0.833-0.866
          # over 8 beside two other runs (2 cores, 5 December 2026), since the workers' changes
          # to the moving statistics add up on the ps (before, each worker's assignment
          # overwrote the other's: 0.36-0.84)
          ("ps", "keras_model"): 0.73}


def run(distrain, args, log, timeout=240):
    with open(log, "w") as f:
        p = subprocess.run([distrain] + args, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    return p.returncode


def tail(log, n=8):
    with open(log) as f:
        return "".join(f.readlines()[-n:])


def last_csv_row(path):
    with open(path) as f:
        lines = [l.strip() for l in f if l.strip()]
    head, last = lines[0].split(","), lines[-1].split(",")
    return dict(zip(head, last))


def kill_after_backup(distrain, args, backup_dir, log, step):
    """Starts distrain (its own process group: --workers spawns children) and SIGKILLs the
    whole group once the backup of global step `step` exists."""
    with open(log, "w") as f:
        p = subprocess.Popen([distrain] + args, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
    deadline = time.time() + 240
    want = os.path.join(backup_dir, "ckpt-%d.safetensors" % step)
    while not os.path.exists(want):
        if p.poll() is not None:
            raise AssertionError("exited (%s) before the backup of step %d" % (p.returncode, step))
        if time.time() > deadline:
            os.killpg(p.pid, signal.SIGKILL)
            raise AssertionError("no backup of step %d after 240 s" % step)
        time.sleep(0.02)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()


def case(distrain, jpeg_dir, work, strategy, feature):
    flags, floor, check = FEATURES[feature]
    floor = FLOORS.get((strategy, feature), floor)
    d = os.path.join(work, "%s.%s" % (strategy, feature))
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    args = STRATEGIES[strategy] + flags + ["--quiet", "--seed", "7",
                                           "--metrics-json", os.path.join(d, "m.json"),
                                           "--csv-log", os.path.join(d, "log.csv")]
    if feature == "jpeg_folder":
        args += ["--data-dir", jpeg_dir]
    log = os.path.join(d, "run.log")
    notes = []
    if check == "resume":
        ref = args + ["--save-weights", os.path.join(d, "reference.safetensors")]
        if run(distrain, ref, os.path.join(d, "reference.log")):
            return False, "the uninterrupted run failed: " + tail(os.path.join(d, "reference.log"))
        shutil.move(os.path.join(d, "m.json"), os.path.join(d, "reference.json"))
        os.remove(os.path.join(d, "log.csv"))
        backup = os.path.join(d, "backup")
        resumed = args + ["--backup-dir", backup, "--save-weights",
                          os.path.join(d, "resumed.safetensors")]
        at = 100 if feature == "resume_with_callbacks" else 20
        kill_after_backup(distrain, resumed, backup, os.path.join(d, "killed.log"), at)
        args = resumed
    if run(distrain, args, log):
        return False, "exited non-zero: " + tail(log)
    with open(os.path.join(d, "m.json")) as f:
        m = json.load(f)
    acc = m["test_accuracy"]
    ok = acc >= floor
    notes.append("test_accuracy %.4f (floor %.2f)" % (acc, floor))
    if check == "val_accuracy":
        val = float(last_csv_row(os.path.join(d, "log.csv"))["val_accuracy"])
        notes.append("val_accuracy %.4f" % val)
        ok = ok and val >= floor
    if check == "steps":
        notes.append("steps %d" % m["steps"])
        ok = ok and m["steps"] == 45
    if check == "resume":
        with open(os.path.join(d, "reference.safetensors"), "rb") as a, \
                open(os.path.join(d, "resumed.safetensors"), "rb") as b:
            same = a.read() == b.read()
        notes.append("resumed weights %s the uninterrupted run's" % ("equal" if same else "DIFFER from"))
        ok = ok and same
    return ok, ", ".join(notes)


def main():
    distrain, jpeg_dir, work = sys.argv[1:4]
    only = sys.argv[4] if len(sys.argv) > 4 else ""
    os.makedirs(work, exist_ok=True)
    passed = failed = 0
    start = time.time()
    for strategy in STRATEGIES:
        for feature in FEATURES:
            name = "%s x %s" % (strategy, feature)
            if only and only not in name:
                continue
            if feature in SKIP.get(strategy, {}):
                print("skip %-34s         %s" % (name, SKIP[strategy][feature]), flush=True)
                continue
            t0 = time.time()
            try:
                ok, why = case(distrain, jpeg_dir, work, strategy, feature)
            except (AssertionError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
                ok, why = False, "%s: %s" % (type(e).__name__, e)
            print("%s %-34s %5.1f s  %s" % ("ok  " if ok else "FAIL", name, time.time() - t0, why),
                  flush=True)
            passed += ok
            failed += not ok
    print("scenario: %.0f s" % (time.time() - start))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
