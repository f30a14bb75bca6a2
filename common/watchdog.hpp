#pragma once
/// @file watchdog.hpp
/// The hang watchdog: every collective (and send/recv) of common/comm registers itself on entry
/// and exit. One that is still unfinished after the timeout ends the job with exit code 3 and a
/// report that leads with the rank whose own progress stopped, then the chain of waits it causes,
/// then what every rank is doing, e.g. (rank 5 stopped with SIGSTOP)
///
///   [scalelab] watchdog: rank 5 does not run: no heartbeat from it for 10.3 s (the process is
///     stopped or frozen: ...) while ranks 1,4 wait for it; it was last in no collective (computing)
///     rank 4 waits for rank 5 in all_reduce #57 (4 MiB, group dp1) for 10.0 s
///     rank 1 waits for rank 5 in recv #12 (1 MiB, group pp1, from rank 1) for 10.0 s
///     ranks 0,2,3,6,7 wait for ranks 1,4 in all_reduce #58 (4 B, group world) for 10.0 s
///     seen from rank 2, which waits in all_reduce #58 (4 B, group world) for 10.1 s;
///     ...
///     group world sequence numbers: rank 0 in all_reduce #58, ..., rank 5 finished #57, frozen
///
/// How it works without the stuck collective, and without MPI:
/// - each rank's watchdog thread writes the rank's state (what it waits in, the last finished
///   sequence number of each group, when it last entered or left an operation) to a small status
///   file in a run directory every 100 ms, with the time of writing: the heartbeat;
/// - the rank whose oldest registered operation passed the timeout reads every rank's file,
///   prints the report on stderr and _exit(3)s; the launcher (mpirun, srun) then ends the others.
///   A lock file makes sure one rank reports when several time out together.
/// - A stopped process cannot answer, so the report infers who stopped: a rank whose heartbeat is
///   older than stale_after(timeout) does not run at all (stopped, frozen, its node gone); a rank
///   that others wait for, directly or through a chain, and that is in no operation, has stopped
///   progressing (it skipped a collective, or is stuck computing) although its watchdog still
///   beats. Those ranks lead the report. When there is none (every rank waits, e.g. ranks that
///   called different collectives), the reporting rank leads, as before.
/// Sequence numbers count a group's collectives on each rank, so a rank that skipped one shows a
/// smaller number than its peers in the report, even when it entered the next one of the same kind
/// and MPI matched that with the peers' previous one.
///
/// The run directory is shared by the ranks of one job and found without talking to them:
///   ${SCALELAB_RUN_DIR:-${TMPDIR:-/tmp}}/scalelab-watchdog-JOB
/// with JOB from SCALELAB_JOB_ID, else the launcher's job id (PMIX_NAMESPACE of Open MPI/PMIx,
/// SLURM_JOB_ID.SLURM_STEP_ID), else the launcher's process id (every rank of a one-node job has
/// the same parent), else this process's id (a singleton). For jobs across nodes set
/// SCALELAB_RUN_DIR to a directory on a shared file system (otherwise each node's report only
/// sees that node's ranks). Times in the status files are wall-clock times, so ranks on different
/// nodes compare them (NTP keeps the nodes' clocks within milliseconds).
///
/// Cleaning up: every rank writes owner-RANK.txt (host, pid, the process's start time) into the
/// run directory; a rank that ends normally removes its files and the last one the directory. A
/// job killed, aborted or crashed leaves it: the next start() of any job removes every
/// scalelab-watchdog-* directory under the same base whose owners on this host are all gone (a
/// pid reused by another process counts as gone). A directory with a live owner, or with owners
/// on another host, is never touched; one with no owner file (an older build's, or one being
/// created) only after kOwnerlessAge seconds without a change.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace scalelab::watchdog {

/// Default timeout in seconds (the --timeout default).
constexpr double kDefaultTimeout = 60.0;

/// The watchdog thread looks every kPeriod seconds (and writes the heartbeat): a shorter timeout
/// cannot be kept, so it is refused (--timeout 1e-300 used to be accepted and mean 0.1 s).
constexpr double kPeriod = 0.1;

/// Starts the watchdog thread (idempotent: later calls only change the timeout). Not collective.
/// Communicators start it themselves with the current timeout, so calling this is only needed to
/// change the timeout (cli --timeout, tests via SCALELAB_TIMEOUT).
void start(double timeout_s);

/// Sets the timeout without starting anything (the next start() uses it). Below kPeriod, or not a
/// number: UsageError.
void set_timeout(double timeout_s);
/// The timeout in seconds.
double timeout();

/// Reads SCALELAB_TIMEOUT (seconds) if set and valid, else `fallback`.
double timeout_from_env(double fallback);

/// Seconds after which a run directory without owner files counts as abandoned.
constexpr double kOwnerlessAge = 600.0;

/// Removes the scalelab-watchdog-* directories under `base` whose owners are all gone (see
/// above), except `keep` (this job's). Returns how many were removed. start() calls it; exposed
/// for tests.
int remove_stale_run_dirs(const std::string& base, const std::string& keep = "",
                          double ownerless_age_s = kOwnerlessAge);

/// Whether the process an owner file's line names ("host\tpid\tstart") may still run: true for
/// another host's process and for an unreadable line; false when the pid is gone or now
/// belongs to a process with another start time.
bool owner_alive(const std::string& owner_line);

/// The shared run directory (created on start()).
std::string run_dir();

/// A group of ranks (a communicator) as the report names it.
int register_group(std::string_view name, std::vector<int> world_ranks);

/// Registers an operation on entry; returns a token for leave(). `seq` is the group's sequence
/// number (collectives) or the point-to-point count; `collective` says which, so only
/// collectives update the group's "last finished" number. `peer`: for a send or receive, the
/// peer's rank in the group (the report follows the wait to it).
std::uint64_t enter(int group, std::string_view kind, std::int64_t seq, std::size_t bytes,
                    bool collective, std::string_view detail = {}, int peer = -1);

/// Registers the operation's exit (finished, or failed with an error).
void leave(std::uint64_t token);

/// Marks this rank finished and removes its status file (called at exit automatically).
void stop();

/// "4 MiB", "12 B", "1.5 KiB" (the report's and the bench's size format).
std::string format_bytes(std::size_t bytes);

/// Seconds without a heartbeat after which a rank counts as not running: half the timeout, at
/// least 1 s (a live rank's watchdog thread writes every 100 ms, even on a loaded machine) and at
/// most 5 s (so a rank stopped shortly before the timeout is still seen as stopped).
double stale_after(double timeout_s);

/// Builds the report from the status files of `world_size` ranks in `dir`, as seen by `rank`
/// which waits in its oldest operation. Exposed for tests.
std::string build_report(const std::string& dir, int rank, int world_size);

}  // namespace scalelab::watchdog
