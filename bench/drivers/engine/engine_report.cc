#include "bench/drivers/engine/engine_report.h"

#include <ostream>
#include <string>

#include "kit/byte_size.h"
#include "kit/svg_plot.h"
#include "kit/text_table.h"

namespace kvvm::cli {
namespace {

nlohmann::ordered_json decode_json(const DecodeRun& run) {
  nlohmann::ordered_json json;
  json["mode"] = run.mode;
  json["batch"] = run.batch;
  if (!run.skipped.empty()) {
    json["skipped"] = run.skipped;
    return json;
  }
  json["decode_tokens_per_s"] = run.decode_tokens_per_s;
  json["ms_per_step"] = run.ms_per_step;
  json["ms_per_running_step"] = run.ms_per_running_step;
  json["retiring_steps"] = run.retiring_steps;
  json["retiring_ms"] = run.retiring_ms;
  json["decode_tokens"] = run.decode_tokens;
  json["decode_steps"] = run.decode_steps;
  json["decode_seconds"] = run.decode_seconds;
  json["prefill_seconds"] = run.prefill_seconds;
  json["generated_tokens"] = run.generated_tokens;
  json["peak_running"] = run.peak_running;
  json["graph_replays"] = run.graph_replays;
  json["eager_steps"] = run.eager_steps;
  if (run.masks > 0) {
    json["masks"] = run.masks;
    json["mask_us"] = run.mask_us;
  }
  if (run.expert_cache) {
    json["expert_cache"] = {{"lookups", run.expert_lookups},
                            {"hits", run.expert_hits},
                            {"bytes_per_token", run.expert_bytes_per_token},
                            {"copy_seconds", run.expert_copy_seconds}};
  }
  if (!run.note.empty()) json["note"] = run.note;
  return json;
}

nlohmann::ordered_json trace_json(const TraceRun& run) {
  nlohmann::ordered_json json;
  json["system"] = run.system;
  json["rate"] = run.rate;
  json["submitted"] = run.submitted;
  json["completed"] = run.completed;
  json["refused_overloaded"] = run.refused_overloaded;
  json["refused_at_arrival"] = run.refused_at_arrival;
  json["cancelled"] = run.cancelled;
  json["failed"] = run.failed;
  json["not_submitted"] = run.not_submitted;
  json["output_tokens"] = run.output_tokens;
  json["wall_seconds"] = run.wall_seconds;
  json["output_tokens_per_s"] = run.output_tokens_per_s;
  json["steady_start_s"] = run.steady_start_s;
  json["steady_end_s"] = run.steady_end_s;
  json["steady_output_tokens_per_s"] = run.steady_output_tokens_per_s;
  json["ttft_p50_s"] = run.ttft_p50_s;
  json["ttft_p99_s"] = run.ttft_p99_s;
  json["tpot_p50_s"] = run.tpot_p50_s;
  json["tpot_p99_s"] = run.tpot_p99_s;
  json["peak_running"] = run.peak_running;
  json["prefix_hit_tokens"] = run.prefix_hit_tokens;
  json["preemptions"] = run.preemptions;
  json["kv_map_seconds"] = run.kv_map_seconds;
  json["kv_unmap_seconds"] = run.kv_unmap_seconds;
  json["kv_create_release_seconds"] = run.kv_create_release_seconds;
  json["kv_map_calls"] = run.kv_map_calls;
  json["kv_unmap_calls"] = run.kv_unmap_calls;
  json["reused_admissions"] = run.reused_admissions;
  json["shared_admissions"] = run.shared_admissions;
  json["reuse_fence_pending"] = run.reuse_fence_pending;
  json["prefix_kept_reclaims"] = run.prefix_kept_reclaims;
  if (!run.first_error.empty()) json["first_error"] = run.first_error;
  if (!run.note.empty()) json["note"] = run.note;
  return json;
}

nlohmann::ordered_json choices_json(const ChoicesRun& run) {
  nlohmann::ordered_json json;
  json["system"] = run.system;
  json["n"] = run.n;
  json["peak_kv_bytes"] = run.peak_kv_bytes;
  json["seconds"] = run.seconds;
  json["generated_tokens"] = run.generated_tokens;
  json["steps"] = run.steps;
  json["forks"] = run.forks;
  json["prefix_hit_tokens"] = run.prefix_hit_tokens;
  return json;
}

std::string ms(double seconds) { return fixed(seconds * 1000, 1); }

}  // namespace

// Milliseconds a step in each phase; steps as counted.
nlohmann::ordered_json phases_json(const engine::StepPhaseSeconds& p) {
  const double n = p.steps == 0 ? 1.0 : static_cast<double>(p.steps);
  nlohmann::ordered_json o;
  o["steps"] = p.steps;
  o["schedule"] = p.schedule * 1e3 / n;
  o["prepare"] = p.prepare * 1e3 / n;
  o["launch"] = p.launch * 1e3 / n;
  o["wait"] = p.wait * 1e3 / n;
  o["update"] = p.update * 1e3 / n;
  o["deliver"] = p.deliver * 1e3 / n;
  return o;
}

nlohmann::ordered_json bench_engine_json(const BenchEngineReport& report) {
  nlohmann::ordered_json json;
  json["model"] = report.model_dir;
  json["architecture"] = report.architecture;
  json["backend"] = report.backend;
  if (!report.kernels.empty()) json["kernels"] = report.kernels;
  json["layers"] = report.layers;
  json["vocab_size"] = report.vocab_size;
  json["max_context"] = report.max_context;
  json["kv_budget"] = report.kv_budget;
  json["kv_dtype"] = report.kv_dtype;
  json["kv_bytes_per_token"] = report.kv_bytes_per_token;
  json["preallocated_capacity"] = report.preallocated_capacity;
  json["max_running"] = report.max_running;
  nlohmann::ordered_json weights;
  weights["placement"] = report.weights;
  weights["dummy"] = report.dummy_weights;
  weights["device_bytes"] = report.weights_device_bytes;
  weights["streamed_layers"] = report.weights_streamed_layers;
  weights["ring_slots"] = report.weights_ring_slots;
  weights["streamed_bytes_per_step"] = report.weights_streamed_bytes_per_step;
  weights["load_bytes"] = report.load_bytes;
  weights["load_seconds"] = report.load_seconds;
  json["weights"] = std::move(weights);
  nlohmann::ordered_json decode;
  decode["prompt_tokens"] = report.prompt_tokens;
  decode["decode_tokens"] = report.decode_tokens;
  decode["runs"] = nlohmann::ordered_json::array();
  for (const DecodeRun& run : report.decode) decode["runs"].push_back(decode_json(run));
  decode["logprobs"] = report.logprobs;
  json["decode"] = std::move(decode);
  if (!report.choices.empty()) {
    nlohmann::ordered_json choices;
    choices["prompt_tokens"] = report.choices_prompt_tokens;
    choices["tokens"] = report.choices_tokens;
    choices["runs"] = nlohmann::ordered_json::array();
    for (const ChoicesRun& run : report.choices) choices["runs"].push_back(choices_json(run));
    json["choices"] = std::move(choices);
  }
  if (!report.offline.empty()) {
    nlohmann::ordered_json offline = nlohmann::ordered_json::array();
    for (const OfflineRun& run : report.offline) {
      nlohmann::ordered_json o;
      o["lengths"] = run.label;
      o["requests"] = run.requests;
      o["input_tokens"] = run.input_tokens;
      o["output_tokens"] = run.output_tokens;
      o["max_running"] = run.max_running;
      o["peak_running"] = run.peak_running;
      o["warmup_requests"] = run.warmup;
      o["seconds"] = run.seconds;
      o["output_tokens_per_s"] = run.output_tokens_per_s;
      o["total_tokens_per_s"] = run.total_tokens_per_s;
      o["requests_per_s"] = run.requests_per_s;
      o["latency_p50_s"] = run.latency_p50_s;
      o["latency_p99_s"] = run.latency_p99_s;
      o["ttft_p50_s"] = run.ttft_p50_s;
      o["ttft_p99_s"] = run.ttft_p99_s;
      o["tpot_p50_ms"] = run.tpot_p50_ms;
      o["tpot_p99_ms"] = run.tpot_p99_ms;
      o["steps"] = run.steps;
      o["graph_replays"] = run.graph_replays;
      o["preemptions"] = run.preemptions;
      o["step_phases_ms"] = phases_json(run.phases);
      if (run.spec_drafts > 0) {
        o["speculative"] = {{"drafts", run.spec_drafts},
                            {"draft_tokens", run.spec_draft_tokens},
                            {"accepted_tokens", run.spec_accepted_tokens}};
      }
      if (!run.note.empty()) o["note"] = run.note;
      offline.push_back(std::move(o));
    }
    json["offline"] = std::move(offline);
  }
  nlohmann::ordered_json trace;
  trace["requests"] = report.trace_requests;
  trace["tenants"] = report.tenants;
  trace["system_prompt_tokens"] = report.system_prompt_tokens;
  trace["seed"] = report.seed;
  trace["duration_limit_s"] = report.duration_limit_s;
  trace["max_queue_wait_s"] = report.max_queue_wait_s;
  trace["parked_slots"] = report.parked_slots;
  trace["runs"] = nlohmann::ordered_json::array();
  for (const TraceRun& run : report.trace) trace["runs"].push_back(trace_json(run));
  json["trace"] = std::move(trace);
  json["wall_seconds"] = report.wall_seconds;
  return json;
}

void print_bench_engine(const BenchEngineReport& report, std::ostream& out) {
  out << "kvvm bench engine: " << report.model_dir << " (" << report.architecture << ", "
      << report.layers << " layers, vocab " << report.vocab_size << ") on " << report.backend
      << (report.kernels.empty() ? "" : " (" + report.kernels + " kernels)") << "; max context "
      << report.max_context << ", max running " << report.max_running
      << "\nKV: " << format_bytes(report.kv_budget) << " budget, " << report.kv_dtype << ", "
      << format_bytes(report.kv_bytes_per_token) << " per token; preallocated holds "
      << report.preallocated_capacity << " sequences of max context\n"
      << report.weights << (report.dummy_weights ? " (dummy weights)" : "") << "; loaded "
      << format_bytes(report.load_bytes) << " in " << format_duration(report.load_seconds) << " ("
      << format_byte_rate(report.load_seconds > 0 ? report.load_bytes / report.load_seconds : 0)
      << ")\n";
  if (!report.decode.empty()) {
    out << "\nDecode (" << report.prompt_tokens << "-token random prompts, " << report.decode_tokens
        << " greedy tokens each, end tokens ignored; timed after every sequence has its first "
           "token):\n";
    TextTable table({"mode", "batch", "tokens/s", "ms/step", "steps", "ms/step ending none",
                     "ending steps (ms)", "prefill s", "peak", "graph replays"},
                    1, "note");
    for (const DecodeRun& run : report.decode) {
      if (!run.skipped.empty()) {
        table.add({run.mode, str(run.batch)}, "skipped: " + run.skipped);
        continue;
      }
      table.add(
          {run.mode, str(run.batch), fixed(run.decode_tokens_per_s, 1), fixed(run.ms_per_step, 3),
           str(run.decode_steps), fixed(run.ms_per_running_step, 3),
           str(run.retiring_steps) + " (" + fixed(run.retiring_ms, 1) + ")",
           fixed(run.prefill_seconds, 3), str(run.peak_running), str(run.graph_replays)},
          run.note);
    }
    table.print(out);
  }
  if (!report.choices.empty()) {
    out << "\nChoices (one " << report.choices_prompt_tokens << "-token random prompt, "
        << report.choices_tokens
        << " greedy tokens per answer: one request of n choices forking its KV, against n "
           "requests at once with the prefix cache on):\n";
    TextTable table(
        {"system", "n", "peak KV", "s to last token", "tokens", "steps", "forks", "hit tokens"}, 1);
    for (const ChoicesRun& run : report.choices) {
      table.add({run.system, str(run.n), format_bytes(run.peak_kv_bytes), fixed(run.seconds, 3),
                 str(run.generated_tokens), str(run.steps), str(run.forks),
                 str(run.prefix_hit_tokens)});
    }
    table.print(out);
    if (report.choices.size() == 2 && report.choices[1].peak_kv_bytes > 0 &&
        report.choices[1].seconds > 0) {
      out << "fork / requests: peak KV "
          << fixed(static_cast<double>(report.choices[0].peak_kv_bytes) /
                       static_cast<double>(report.choices[1].peak_kv_bytes),
                   3)
          << "x, time " << fixed(report.choices[0].seconds / report.choices[1].seconds, 3) << "x\n";
    }
  }
  if (!report.offline.empty()) {
    out << "\nOffline (every request submitted at once, random prompts, greedy, each answer run "
           "to its output length; a warm-up excluded; over the whole run):\n";
    TextTable table(
        {"lengths", "requests", "out tok/s", "total tok/s", "req/s", "latency p50 s", "p99",
         "TTFT p50 s", "p99", "TPOT p50 ms", "p99", "running", "peak", "steps", "preempt"},
        1, "note");
    for (const OfflineRun& run : report.offline) {
      table.add({run.label, str(run.requests), fixed(run.output_tokens_per_s, 1),
                 fixed(run.total_tokens_per_s, 1), fixed(run.requests_per_s, 2),
                 fixed(run.latency_p50_s, 3), fixed(run.latency_p99_s, 3), fixed(run.ttft_p50_s, 3),
                 fixed(run.ttft_p99_s, 3), fixed(run.tpot_p50_ms, 2), fixed(run.tpot_p99_ms, 2),
                 str(run.max_running), str(run.peak_running), str(run.steps), str(run.preemptions)},
                run.note);
    }
    table.print(out);
    out << "\nWhere an offline step's time went (ms a step, the host's clock; `launch` holds the "
           "device's work the launches overlap, `wait` the device's tail; the rest leaves the "
           "device idle):\n";
    TextTable phases({"lengths", "steps", "schedule", "prepare", "launch", "wait", "update",
                      "deliver", "host-only share"},
                     1);
    for (const OfflineRun& run : report.offline) {
      const engine::StepPhaseSeconds& p = run.phases;
      const double n = p.steps == 0 ? 1.0 : static_cast<double>(p.steps);
      const double host = p.schedule + p.prepare + p.update + p.deliver;
      const double all = host + p.launch + p.wait;
      phases.add({run.label, str(p.steps), fixed(p.schedule * 1e3 / n, 3),
                  fixed(p.prepare * 1e3 / n, 3), fixed(p.launch * 1e3 / n, 3),
                  fixed(p.wait * 1e3 / n, 3), fixed(p.update * 1e3 / n, 3),
                  fixed(p.deliver * 1e3 / n, 3), all > 0 ? fixed(host / all, 3) : "-"});
    }
    phases.print(out);
    for (const OfflineRun& run : report.offline) {
      if (run.spec_drafts == 0) continue;
      out << "Speculative decoding, " << run.label << ": " << run.spec_accepted_tokens << " of "
          << run.spec_draft_tokens << " proposals kept ("
          << fixed(run.spec_draft_tokens == 0 ? 0.0
                                              : static_cast<double>(run.spec_accepted_tokens) /
                                                    static_cast<double>(run.spec_draft_tokens),
                   3)
          << "), "
          << fixed(static_cast<double>(run.spec_accepted_tokens + run.spec_drafts) /
                       static_cast<double>(run.spec_drafts),
                   2)
          << " tokens a verified sequence step (a draft model's forwards are in `schedule`, the "
             "verify rows in `launch` and `wait`)\n";
    }
  }
  if (!report.trace.empty()) {
    out << "\nTrace replay (open loop, " << report.trace_requests << " requests per rate, "
        << report.tenants << " tenants with " << report.system_prompt_tokens
        << "-token system prompts, seed " << report.seed;
    if (report.duration_limit_s > 0) out << ", limit " << fixed(report.duration_limit_s, 1) << " s";
    out << ", queue wait " << fixed(report.max_queue_wait_s, 1) << " s, " << report.parked_slots
        << " parked slots";
    out << "):\n";
    TextTable table({"system", "rate", "out tok/s", "loaded tok/s", "TTFT p50 ms", "p99",
                     "TPOT p50 ms", "p99", "peak", "hit tokens", "done", "429", "cancel", "fail",
                     "preempt", "KV map/unmap s", "reused/shared"},
                    1, "note");
    for (const TraceRun& run : report.trace) {
      table.add(
          {run.system, fixed(run.rate, 2), fixed(run.output_tokens_per_s, 1),
           run.steady_output_tokens_per_s > 0 ? fixed(run.steady_output_tokens_per_s, 1) : "-",
           ms(run.ttft_p50_s), ms(run.ttft_p99_s), ms(run.tpot_p50_s), ms(run.tpot_p99_s),
           str(run.peak_running), str(run.prefix_hit_tokens),
           str(run.completed) + "/" + str(run.submitted), str(run.refused_overloaded),
           str(run.cancelled), str(run.failed), str(run.preemptions),
           fixed(run.kv_map_seconds, 2) + "/" + fixed(run.kv_unmap_seconds, 2),
           str(run.reused_admissions) + "/" + str(run.shared_admissions)},
          run.first_error);
    }
    table.print(out);
    out << "(loaded tok/s: from the first to the last moment the engine held 9/10 of its peak "
           "running; '-' when that is under a second)\n";
  }
  out << "\nWall time " << fixed(report.wall_seconds, 1) << " s\n";
}

std::string bench_engine_svg(const BenchEngineReport& report) {
  SvgChart chart;
  chart.title = "kvvm bench engine: " + report.architecture + " on " + report.backend;
  chart.x_label = "request rate (requests/s)";
  chart.y_label = "output tokens/s";
  const std::pair<const char*, const char*> systems[] = {{"arena", "#1f77b4"},
                                                         {"preallocated", "#d62728"}};
  for (const auto& [name, color] : systems) {
    SvgSeries series{name, color, {}};
    for (const TraceRun& run : report.trace) {
      if (run.system == name) series.points.emplace_back(run.rate, run.output_tokens_per_s);
    }
    chart.series.push_back(std::move(series));
  }
  return render_svg_line_chart(chart);
}

}  // namespace kvvm::cli
