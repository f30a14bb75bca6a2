// Lab 08, GIVEN: actions, their text, the piece arithmetic of virtual stages, the schedule
// validator and the simulator (see schedule.hpp). Nothing here is an exercise.
#include "schedule.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include <fmt/format.h>

namespace scalelab::lab08 {

namespace {

const char* op_code(Op op) {
  switch (op) {
    case Op::recv_activation: return "rA";
    case Op::forward: return "F";
    case Op::send_activation: return "sA";
    case Op::recv_gradient: return "rG";
    case Op::backward: return "B";
    case Op::send_gradient: return "sG";
  }
  return "?";
}

bool is_compute(Op op) { return op == Op::forward || op == Op::backward; }

// A message is known by what it carries and where it goes: (activation?, mb, stage, chunk) of
// the RECEIVING piece.
using MessageKey = std::tuple<bool, int, int, int>;

}  // namespace

std::string to_string(const Action& a) {
  std::string s = fmt::format("{}{}", op_code(a.op), a.mb);
  if (a.chunk != 0) s += fmt::format(".{}", a.chunk);
  return s;
}

std::string to_string(const Schedule& s) {
  std::string out;
  for (const Action& a : s) out += (out.empty() ? "" : " ") + to_string(a);
  return out;
}

std::string compute_order(const Schedule& s) {
  std::string out;
  for (const Action& a : s)
    if (is_compute(a.op)) out += (out.empty() ? "" : " ") + to_string(a);
  return out;
}

Piece next_piece(int p, int v, int stage, int chunk) {
  const int vs = chunk * p + stage + 1;
  if (vs >= p * v) return {};
  return {vs % p, vs / p, true};
}

Piece prev_piece(int p, int v, int stage, int chunk) {
  const int vs = chunk * p + stage - 1;
  if (vs < 0) return {};
  return {vs % p, vs / p, true};
}

std::vector<std::string> validate(const Schedule& s, int p, int m, int v, int stage) {
  std::vector<std::string> errors;
  struct State {
    bool got_act = false, fwd = false, sent_act = false, got_grad = false, bwd = false,
         sent_grad = false;
  };
  std::map<std::pair<int, int>, State> st;
  auto err = [&](std::size_t i, const Action& a, const std::string& why) {
    errors.push_back(fmt::format("stage {}: action {} ({}): {}", stage, i, to_string(a), why));
  };
  for (std::size_t i = 0; i < s.size(); ++i) {
    const Action& a = s[i];
    if (a.mb < 0 || a.mb >= m || a.chunk < 0 || a.chunk >= v) {
      err(i, a, fmt::format("micro-batch or chunk out of range (m = {}, v = {})", m, v));
      continue;
    }
    State& x = st[{a.mb, a.chunk}];
    const bool has_prev = prev_piece(p, v, stage, a.chunk).exists;
    const bool has_next = next_piece(p, v, stage, a.chunk).exists;
    switch (a.op) {
      case Op::recv_activation:
        if (!has_prev) err(i, a, "the model's first piece receives no activation");
        else if (x.got_act) err(i, a, "received twice");
        x.got_act = true;
        break;
      case Op::forward:
        if (x.fwd) err(i, a, "forwarded twice");
        else if (has_prev && !x.got_act) err(i, a, "forward before its activation arrived");
        x.fwd = true;
        break;
      case Op::send_activation:
        if (!has_next) err(i, a, "the model's last piece sends no activation");
        else if (!x.fwd) err(i, a, "sent before its forward");
        else if (x.sent_act) err(i, a, "sent twice");
        x.sent_act = true;
        break;
      case Op::recv_gradient:
        if (!has_next) err(i, a, "the model's last piece receives no gradient");
        else if (x.got_grad) err(i, a, "received twice");
        x.got_grad = true;
        break;
      case Op::backward:
        if (x.bwd) err(i, a, "backwarded twice");
        else if (!x.fwd) err(i, a, "backward before its forward");
        else if (has_next && !x.got_grad) err(i, a, "backward before its gradient arrived");
        x.bwd = true;
        break;
      case Op::send_gradient:
        if (!has_prev) err(i, a, "the model's first piece sends no gradient");
        else if (!x.bwd) err(i, a, "sent before its backward");
        else if (x.sent_grad) err(i, a, "sent twice");
        x.sent_grad = true;
        break;
    }
  }
  for (int c = 0; c < v; ++c)
    for (int mb = 0; mb < m; ++mb) {
      const State& x = st[{mb, c}];
      const bool has_prev = prev_piece(p, v, stage, c).exists;
      const bool has_next = next_piece(p, v, stage, c).exists;
      const std::string what = to_string(Action{Op::forward, mb, c}).substr(1);
      if (!x.fwd) errors.push_back(fmt::format("stage {}: micro-batch {} never forwarded", stage, what));
      if (!x.bwd) errors.push_back(fmt::format("stage {}: micro-batch {} never backwarded", stage, what));
      if (has_next && !x.sent_act)
        errors.push_back(fmt::format("stage {}: activation {} never sent", stage, what));
      if (has_prev && !x.sent_grad)
        errors.push_back(fmt::format("stage {}: gradient {} never sent", stage, what));
    }
  return errors;
}

SimResult simulate(const std::vector<Schedule>& schedules, int m, int v, Costs costs) {
  SimResult r;
  const int p = static_cast<int>(schedules.size());
  for (int s = 0; s < p; ++s)
    for (std::string& e : validate(schedules[s], p, m, v, s)) r.errors.push_back(std::move(e));
  if (!r.errors.empty()) return r;

  // A chunk holds 1/v of the stage's layers, so it costs 1/v of the stage's time.
  const double f = static_cast<double>(costs.forward) / v, b = static_cast<double>(costs.backward) / v;
  std::vector<std::size_t> pc(p, 0);
  std::vector<double> clock(p, 0);
  std::vector<int> in_flight(p, 0);
  r.spans.assign(p, {});
  r.max_in_flight.assign(p, 0);
  std::map<MessageKey, double> sent;  // message -> time its send was started

  auto key_of_recv = [&](int s, const Action& a) {
    return MessageKey{a.op == Op::recv_activation, a.mb, s, a.chunk};
  };
  auto key_of_send = [&](int s, const Action& a) {
    const Piece to = a.op == Op::send_activation ? next_piece(p, v, s, a.chunk)
                                                  : prev_piece(p, v, s, a.chunk);
    return MessageKey{a.op == Op::send_activation, a.mb, to.stage, to.chunk};
  };

  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      while (pc[s] < schedules[s].size()) {
        const Action& a = schedules[s][pc[s]];
        if (a.op == Op::recv_activation || a.op == Op::recv_gradient) {
          auto it = sent.find(key_of_recv(s, a));
          if (it == sent.end()) break;  // blocked: the neighbour has not sent it yet
          clock[s] = std::max(clock[s], it->second);
        } else if (a.op == Op::send_activation || a.op == Op::send_gradient) {
          sent[key_of_send(s, a)] = clock[s];
        } else {
          const double cost = a.op == Op::forward ? f : b;
          r.spans[s].push_back({a, clock[s], clock[s] + cost});
          clock[s] += cost;
          in_flight[s] += a.op == Op::forward ? 1 : -1;
          r.max_in_flight[s] = std::max(r.max_in_flight[s], in_flight[s]);
        }
        ++pc[s];
        progress = true;
      }
    }
  }

  for (int s = 0; s < p; ++s) {
    if (pc[s] == schedules[s].size()) continue;
    r.deadlock = true;
    const Action& a = schedules[s][pc[s]];
    const bool act = a.op == Op::recv_activation;
    const Piece from = act ? prev_piece(p, v, s, a.chunk) : next_piece(p, v, s, a.chunk);
    // Does the neighbour's schedule send it at all, and if so where is the neighbour stuck?
    const Op send_op = act ? Op::send_activation : Op::send_gradient;
    const Schedule& theirs = schedules[from.stage];
    std::string why = "which it never sends";
    for (std::size_t i = 0; i < theirs.size(); ++i)
      if (theirs[i].op == send_op && theirs[i].mb == a.mb &&
          key_of_send(from.stage, theirs[i]) == key_of_recv(s, a)) {
        why = pc[from.stage] < theirs.size()
                  ? fmt::format("which sends it at its action {}, but is itself stuck at action "
                                "{} ({})", i, pc[from.stage], to_string(theirs[pc[from.stage]]))
                  : fmt::format("which sends it at its action {}", i);
        break;
      }
    r.report += fmt::format("stage {} waits at its action {} of {} ({}: the {} of micro-batch {}"
                            "{}) for stage {}, {}\n",
                            s, pc[s], schedules[s].size(), to_string(a),
                            act ? "activation" : "gradient", a.mb,
                            v > 1 ? fmt::format(", chunk {}", a.chunk) : std::string(),
                            from.stage, why);
  }
  if (r.deadlock) return r;

  for (int s = 0; s < p; ++s) r.makespan = std::max(r.makespan, clock[s]);
  for (int s = 0; s < p; ++s) {
    double busy = 0;
    for (const Span& sp : r.spans[s]) busy += sp.end - sp.begin;
    r.bubble.push_back(r.makespan > 0 ? 1.0 - busy / r.makespan : 0.0);
  }
  return r;
}

std::string ascii_timeline(const std::vector<std::vector<Span>>& spans, double unit,
                           int max_columns) {
  double end = 0;
  bool chunks = false;
  int widest = 1;
  for (const auto& row : spans)
    for (const Span& sp : row) {
      end = std::max(end, sp.end);
      chunks = chunks || sp.action.chunk > 0;
      widest = std::max(widest, sp.action.mb);
    }
  if (end <= 0 || unit <= 0) return "";
  // A column is always `unit`: a longer timeline is cut after max_columns whole cells, and says
  // so (squeezing it into max_columns would drop the actions shorter than a column, unseen).
  const int all_columns = static_cast<int>(std::ceil(end / unit - 1e-9));
  const int columns = std::min(all_columns, std::max(max_columns, 1));
  const int width = 1 + static_cast<int>(fmt::format("{}", widest).size()) + (chunks ? 1 : 0) + 1;
  std::string out;
  for (std::size_t s = 0; s < spans.size(); ++s) {
    std::string line = fmt::format("stage {} |", s);
    for (int c = 0; c < columns; ++c) {
      const double t = (c + 0.5) * unit;
      std::string cell = ".";
      for (const Span& sp : spans[s])
        if (sp.begin <= t && t < sp.end) {
          cell = fmt::format("{}{}", sp.action.op == Op::forward ? 'F' : 'B', sp.action.mb);
          if (chunks) cell += static_cast<char>('a' + sp.action.chunk);
          break;
        }
      line += fmt::format(" {:<{}}", cell, width - 1);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  if (columns < all_columns) out += fmt::format("(cut: {} more columns)\n", all_columns - columns);
  return out;
}

}  // namespace scalelab::lab08
