#pragma once
/// @file schedule.hpp
/// Lab 08, GIVEN (not an exercise): what a pipeline schedule is made of, and a simulator that
/// runs every stage's list of actions together.
///
/// A schedule is DATA: for one pipeline stage (one rank), the ordered list of what it does in one
/// training step. Six kinds of action, each about one micro-batch `mb` (and one model chunk, for
/// the interleaved schedule: chunk 0 when every rank holds one stage):
///
///   recv_activation  wait for the previous stage's output of mb (stage > 0)
///   forward          run this stage's layers on mb
///   send_activation  start sending this stage's output of mb to the next stage (non-blocking)
///   recv_gradient    wait for the gradient of this stage's output of mb (stage < p - 1)
///   backward         run this stage's backward on mb (frees mb's activations)
///   send_gradient    start sending the gradient of this stage's input of mb to the previous stage
///
/// Sends never block (Communicator::send_async); a receive blocks until the matching send has
/// been started. So a set of schedules deadlocks exactly when stages wait for each other in a
/// cycle, or wait for a message nobody sends; simulate() finds the first such point and names
/// the stages and what each waits for.
///
/// Virtual stages (interleaved 1F1B, lab step 6): with v chunks per rank, the model is cut into
/// p*v pieces; piece `vs` (virtual stage) lives on rank vs % p as its chunk vs / p. So rank s
/// holds pieces s, s + p, s + 2p, ... and an activation leaving rank p - 1's chunk c enters rank
/// 0's chunk c + 1. next_piece / prev_piece give the neighbours; with v = 1 they are the plain
/// stage s + 1 and s - 1.
#include <string>
#include <vector>

namespace scalelab::lab08 {

enum class Op { recv_activation, forward, send_activation, recv_gradient, backward, send_gradient };

/// One action of one stage.
struct Action {
  Op op = Op::forward;
  int mb = 0;     ///< micro-batch
  int chunk = 0;  ///< model chunk on this rank (interleaved); 0 otherwise
  bool operator==(const Action&) const = default;
};

/// One stage's actions in one training step, in order.
using Schedule = std::vector<Action>;

/// "F3", "B3" (compute), "rA3" / "sA3" (receive / send activation), "rG3" / "sG3" (gradient);
/// with chunks: "F3.1" (micro-batch 3, chunk 1).
std::string to_string(const Action& a);
/// Every action, space-separated.
std::string to_string(const Schedule& s);
/// Only the forward and backward actions, space-separated: "F0 F1 B0 F2 B1 B2".
std::string compute_order(const Schedule& s);

/// The neighbouring piece of (stage, chunk) with p stages of v chunks each: where its activation
/// goes (next) or comes from (prev). `exists` is false past either end of the model.
struct Piece {
  int stage = -1, chunk = -1;
  bool exists = false;
};
Piece next_piece(int p, int v, int stage, int chunk);
Piece prev_piece(int p, int v, int stage, int chunk);

/// What each kind of action costs in the simulator (ticks). Communication is free: the
/// simulated bubble is the schedule's alone.
struct Costs {
  int forward = 1;
  int backward = 2;  // backward does about twice the forward's work
};

/// One forward or backward in a timeline: [begin, end) in ticks (simulated) or seconds (measured).
struct Span {
  Action action;
  double begin = 0, end = 0;
};

struct SimResult {
  bool deadlock = false;
  /// When deadlock: one line per stuck stage, "stage 0 waits at its action 2 of 8 (rG0: the
  /// gradient of micro-batch 0) for stage 1, which sends it at its action 5, but is itself stuck
  /// at action 2 (rA1)", or "... for stage 1, which it never sends".
  std::string report;
  std::vector<std::string> errors;        ///< malformed schedules (see validate)
  std::vector<std::vector<Span>> spans;   ///< per stage: its forwards and backwards, in time
  std::vector<int> max_in_flight;         ///< per stage: most micro-batch chunks forwarded but
                                          ///< not yet backwarded at once (activations held)
  double makespan = 0;                    ///< ticks until the last stage finishes
  /// Per stage: idle ticks / makespan (the bubble; every stage does the same work).
  std::vector<double> bubble;
};

/// Problems with one stage's schedule on its own, empty when fine: every (mb, chunk) of
/// m micro-batches and v chunks is forwarded once and backwarded once after its forward; each
/// forward is preceded by its recv_activation (except on the model's first piece) and followed
/// by its send_activation (except on the last piece); the same for backward with gradients.
std::vector<std::string> validate(const Schedule& s, int p, int m, int v, int stage);

/// Runs all p stages' schedules together (schedules[s] is stage s's, v chunks per stage):
/// every stage runs its actions in order; a receive waits until the matching send has happened
/// on the neighbour (then costs nothing), a send never waits. Returns the timeline, the peak
/// number in flight per stage, and the bubble; or deadlock = true with the report of who waits
/// for what. Malformed schedules (validate) fill `errors` and are not run.
SimResult simulate(const std::vector<Schedule>& schedules, int m, int v = 1, Costs costs = {});

/// The timeline as text, one row per stage, one column per `unit` of time: "F3"/"B3" cells
/// (micro-batch number, chunk as a letter a, b, ... when chunks > 1), "." idle:
///   stage 0 | F0 F1 F2 F3 .  .  B0 B0 F4 ...
/// At most `max_columns` columns: a longer timeline is cut after that many whole cells and a last
/// line says how many were left out, "(cut: 75 more columns)".
std::string ascii_timeline(const std::vector<std::vector<Span>>& spans, double unit,
                           int max_columns = 100);

}  // namespace scalelab::lab08
