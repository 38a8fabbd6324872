#include "bench/drivers/grammar/grammar_masks.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "base/format.h"
#include "kit/cli_common.h"
#include "kvvm/grammar/constraint.h"
#include "kvvm/grammar/grammar_cache.h"
#include "kvvm/grammar/matcher.h"
#include "kvvm/tokenizer/tokenizer.h"

namespace kvvm::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Rung {
  std::string name;
  grammar::Constraint constraint;
};

grammar::Constraint schema(std::string text) {
  grammar::Constraint c;
  c.kind = grammar::Constraint::Kind::kJsonSchema;
  c.text = std::move(text);
  return c;
}

// From a flat object to nested ones with $ref and anyOf, then the other kinds.
std::vector<Rung> ladder() {
  std::vector<Rung> rungs;
  rungs.push_back({"schema-flat", schema(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer"},"active":{"type":"boolean"}},
      "required":["name","age","active"],"additionalProperties":false})")});
  rungs.push_back({"schema-nested", schema(R"({"type":"object","properties":{
      "id":{"type":"string","format":"uuid"},
      "status":{"enum":["open","closed","pending review"]},
      "owner":{"type":"object","properties":{"name":{"type":"string","maxLength":40},
        "email":{"type":"string","format":"email"}},"required":["name"],
        "additionalProperties":false},
      "tags":{"type":"array","items":{"type":"string"},"maxItems":8},
      "score":{"type":"number"},"created":{"type":"string","format":"date-time"}},
      "required":["id","status","owner","tags"],"additionalProperties":false})")});
  rungs.push_back({"schema-ref-anyof", schema(R"({"$defs":{"node":{"type":"object","properties":{
      "label":{"anyOf":[{"type":"string"},{"type":"integer"},{"type":"null"}]},
      "weight":{"type":"number"},
      "children":{"type":"array","items":{"$ref":"#/$defs/node"}}},
      "required":["label","children"],"additionalProperties":false}},
      "$ref":"#/$defs/node"})")});
  grammar::Constraint object;
  object.kind = grammar::Constraint::Kind::kJsonObject;
  rungs.push_back({"json-object", object});
  grammar::Constraint regex;
  regex.kind = grammar::Constraint::Kind::kRegex;
  regex.text = R"([a-z0-9._%+-]{1,40}@[a-z0-9-]{1,20}(\.[a-z0-9-]{1,20}){0,3}\.[a-z]{2,6})";
  rungs.push_back({"regex-email", regex});
  grammar::Constraint gbnf;
  gbnf.kind = grammar::Constraint::Kind::kGbnf;
  gbnf.text = R"gbnf(root ::= expr
expr ::= term (ws [-+] ws term)*
term ::= factor (ws [*/] ws factor)*
factor ::= number | "(" ws expr ws ")"
number ::= "-"? [0-9]+ ("." [0-9]+)?
ws ::= " "?
)gbnf";
  rungs.push_back({"gbnf-arithmetic", gbnf});
  grammar::Constraint choices;
  choices.kind = grammar::Constraint::Kind::kChoices;
  choices.choices = {"positive", "negative", "neutral", "mixed", "not applicable"};
  rungs.push_back({"choices", choices});
  return rungs;
}

double quantile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

bool allowed(const std::vector<std::uint32_t>& words, grammar::TokenId t) {
  return (words[static_cast<std::size_t>(t) >> 5] >> (t & 31)) & 1;
}

// The brute-force mask: every token tried, then rolled back.
double brute_force_seconds(grammar::Matcher& m) {
  const auto began = Clock::now();
  const auto n = static_cast<grammar::TokenId>(m.grammar().vocabulary().size());
  for (grammar::TokenId t = 0; t < n; ++t) {
    if (m.accept_token(t)) m.rollback(1);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - began).count();
  return seconds;
}

std::string find_end_token(const tokenizer::Tokenizer& t, const std::string& asked) {
  if (!asked.empty()) return asked;
  for (const char* name :
       {"<|eot_id|>", "<|im_end|>", "<|endoftext|>", "<|end_of_text|>", "</s>"}) {
    if (t.token_id(name)) return name;
  }
  return "";
}

}  // namespace

CLI::App* add_bench_grammar_command(CLI::App& bench, BenchGrammarOptions& options) {
  CLI::App* cmd = bench.add_subcommand(
      "grammar",
      "Structured output on the host: compile time and the time of each token mask over a "
      "real vocabulary, for a ladder of constraints (JSON Schemas, any JSON object, a regex, a "
      "GBNF grammar, choices), beside the brute-force mask. Real vocabularies: `npm ci --prefix "
      "bench/vocabularies` (Llama 3, Qwen2.5).");
  cmd->add_option("--tokenizer", options.tokenizer, "tokenizer.json of the vocabulary")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--end-token", options.end_token,
                  "the end token's text (default: the first of <|eot_id|>, <|im_end|>, "
                  "<|endoftext|>, <|end_of_text|>, </s> the vocabulary has)");
  cmd->add_option("--walks", options.walks, "walks per constraint")
      ->transform(count_validator(1, 10000))
      ->capture_default_str();
  cmd->add_option("--tokens", options.tokens, "tokens per walk at most")
      ->transform(count_validator(1, 100000))
      ->capture_default_str();
  cmd->add_option("--brute-force", options.brute, "states also masked by brute force (0: none)")
      ->transform(count_validator(0, 100))
      ->capture_default_str();
  cmd->add_option("--seed", options.seed, "the walks' random seed")->capture_default_str();
  cmd->add_option("--only", options.only, "one constraint of the ladder, by name");
  cmd->add_flag("--json", options.json, "one JSON document instead of the table");
  return cmd;
}

int run_bench_grammar(const BenchGrammarOptions& options, std::ostream& out, std::ostream& err) {
  auto loaded = tokenizer::Tokenizer::load(options.tokenizer);
  if (!loaded.ok()) {
    err << "kvvm bench grammar: " << loaded.status().to_string() << "\n";
    return exit_code(loaded.status());
  }
  const tokenizer::Tokenizer& tok = **loaded;
  const std::string end_text = find_end_token(tok, options.end_token);
  const auto end = tok.token_id(end_text);
  if (!end) {
    err << "kvvm bench grammar: --end-token '" << end_text
        << "' is not a token of the vocabulary; name one\n";
    return kExitUsage;
  }
  const std::vector<grammar::TokenId> ends{*end};
  auto vocabulary = grammar::Vocabulary::from_tokenizer(tok, ends);
  if (!vocabulary.ok()) {
    err << "kvvm bench grammar: " << vocabulary.status().to_string() << "\n";
    return kExitFailure;
  }
  nlohmann::ordered_json report = {{"tokenizer", options.tokenizer},
                                   {"vocabulary", (*vocabulary)->size()},
                                   {"end_token", end_text},
                                   {"constraints", nlohmann::ordered_json::array()}};
  bool found = options.only.empty();
  for (const Rung& rung : ladder()) {
    if (!options.only.empty() && rung.name != options.only) continue;
    found = true;
    err << "kvvm bench grammar: " << rung.name << "\n";
    grammar::GrammarCacheOptions one;
    one.entries = 1;
    grammar::GrammarCache cache(*vocabulary, one);
    const auto began = Clock::now();
    auto compiled = cache.get(rung.constraint);
    const double compile_seconds = std::chrono::duration<double>(Clock::now() - began).count();
    if (!compiled.ok()) {
      err << "kvvm bench grammar: " << rung.name << ": " << compiled.status().to_string() << "\n";
      return kExitFailure;
    }
    std::mt19937_64 rng(options.seed);
    std::vector<double> mask_seconds, brute_seconds;
    std::vector<std::uint32_t> words((*vocabulary)->mask_words());
    std::uint64_t ended = 0, allowed_sum = 0;
    for (std::uint32_t walk = 0; walk < options.walks; ++walk) {
      grammar::Matcher m(*compiled);
      for (std::uint32_t step = 0; step < options.tokens && !m.ended(); ++step) {
        const auto a = Clock::now();
        m.fill_mask(words);
        mask_seconds.push_back(std::chrono::duration<double>(Clock::now() - a).count());
        if (walk == 0 && brute_seconds.size() < options.brute) {
          brute_seconds.push_back(brute_force_seconds(m));
        }
        std::vector<grammar::TokenId> choices;
        for (grammar::TokenId t = 0; t < static_cast<grammar::TokenId>(words.size() * 32); ++t) {
          if (static_cast<std::size_t>(t) < (*vocabulary)->size() && allowed(words, t)) {
            choices.push_back(t);
          }
        }
        allowed_sum += choices.size();
        if (choices.empty()) break;
        grammar::TokenId next = choices[rng() % choices.size()];
        if (m.can_end() && rng() % 4 == 0) next = *end;  // answers end, sometimes early
        if (!m.accept_token(next)) {
          err << "kvvm bench grammar: " << rung.name << ": a token its mask allowed was refused\n";
          return kExitFailure;
        }
      }
      ended += m.ended() ? 1 : 0;
    }
    const double p50 = quantile(mask_seconds, 0.5);
    const double brute = quantile(brute_seconds, 0.5);
    const grammar::CompileStats& stats = (*compiled)->stats();
    report["constraints"].push_back(nlohmann::ordered_json{
        {"name", rung.name},
        {"compile_seconds", compile_seconds},
        {"partial_stacks", stats.partial_stacks},
        {"uncertain_tokens", stats.uncertain_tokens},
        {"cache_bytes", (*compiled)->cache_bytes()},
        {"masks", mask_seconds.size()},
        {"walks_ended", ended},
        {"mean_allowed", mask_seconds.empty() ? 0.0 : double(allowed_sum) / mask_seconds.size()},
        {"mask_p50_seconds", p50},
        {"mask_p90_seconds", quantile(mask_seconds, 0.9)},
        {"mask_p99_seconds", quantile(mask_seconds, 0.99)},
        {"mask_max_seconds", quantile(mask_seconds, 1.0)},
        {"brute_force_seconds", brute},
        {"brute_force_over_p50", p50 > 0 ? brute / p50 : 0.0}});
  }
  if (!found) {
    err << "kvvm bench grammar: --only '" << options.only
        << "' names no constraint of the ladder\n";
    return kExitUsage;
  }
  if (options.json) {
    out << dump_json(report) << "\n";
    return kExitOk;
  }
  out << "vocabulary " << report["vocabulary"].get<std::size_t>() << " tokens ("
      << options.tokenizer << "), end " << end_text << "\n";
  out << "constraint          compile   stacks   p50       p90       p99       max       brute "
         "force  gain\n";
  for (const auto& c : report["constraints"]) {
    char line[256];
    std::snprintf(line, sizeof line, "%-18s %8s %8llu %9s %9s %9s %9s %12s %6s\n",
                  c["name"].get<std::string>().c_str(),
                  format_duration(c["compile_seconds"].get<double>()).c_str(),
                  static_cast<unsigned long long>(c["partial_stacks"].get<std::uint64_t>()),
                  format_duration(c["mask_p50_seconds"].get<double>()).c_str(),
                  format_duration(c["mask_p90_seconds"].get<double>()).c_str(),
                  format_duration(c["mask_p99_seconds"].get<double>()).c_str(),
                  format_duration(c["mask_max_seconds"].get<double>()).c_str(),
                  format_duration(c["brute_force_seconds"].get<double>()).c_str(),
                  significant(c["brute_force_over_p50"].get<double>()).c_str());
    out << line;
  }
  return kExitOk;
}

}  // namespace kvvm::cli
