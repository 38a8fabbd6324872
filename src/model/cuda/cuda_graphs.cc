// CUDA graphs of decode-only steps (Model::capture_decode_graphs): one captured step per
// batch-size bucket, replayed for every decode step that fits one.
//
// Why a replay is correct for every length: every kernel of the step reads its per-row inputs
// (ids, positions, slots, lengths, last rows, sampling, log-probability and logit-transform rows)
// from the model's static device arrays, and a step's logit-transform entries from a static
// buffer, which the host copies in before each launch, outside the graph; the decode attention's
// split is planned from the graphs' max_length, the bound of every replay. The outputs are copied
// back after the launch, outside the graph too. Rows past a step's own chunks are padding: token
// 0 at position 0 of pad_slot (which the caller keeps committed), no transforms, outputs dropped.
#include <algorithm>
#include <string>
#include <vector>

#include "model/cuda/cuda_model.h"
#include "model/cuda/cuda_status.h"

namespace kvvm::model::detail {
namespace {

bool same_view(const KvView& a, const KvView& b) {
  return a.base == b.base && a.slot_stride == b.slot_stride && a.layer_stride == b.layer_stride &&
         a.kv_stride == b.kv_stride && a.head_stride == b.head_stride &&
         a.token_stride == b.token_stride && a.element_bytes == b.element_bytes &&
         a.head_dim == b.head_dim && a.element == b.element;
}

}  // namespace

GraphStats CudaModel::graph_stats() const {
  return {.graphs = graphs_.size(), .replays = replays_, .eager_steps = eager_steps_};
}

void CudaModel::release_decode_graphs() {
  if (graphs_.empty()) return;
  (void)cudaSetDevice(device_);
  // A replay still in flight holds its exec: wait for it first.
  if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
  for (const DecodeGraph& graph : graphs_) (void)cudaGraphExecDestroy(graph.exec);
  graphs_.clear();
}

Status CudaModel::capture_decode_graphs(const DecodeGraphOptions& options) {
  release_decode_graphs();
  const std::vector<std::uint32_t>& sizes = options.batch_sizes;
  if (sizes.empty()) return Status::InvalidArgument("decode graphs: batch_sizes is empty");
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0 || sizes[i] > limits().max_chunks) {
      return Status::InvalidArgument(
          "decode graphs: batch_sizes[" + std::to_string(i) + "] = " + std::to_string(sizes[i]) +
          " is outside [1, max_chunks " + std::to_string(limits().max_chunks) + "]");
    }
    if (i > 0 && sizes[i] <= sizes[i - 1]) {
      return Status::InvalidArgument(
          "decode graphs: batch_sizes[" + std::to_string(i) + "] = " + std::to_string(sizes[i]) +
          " does not exceed batch_sizes[" + std::to_string(i - 1) +
          "] = " + std::to_string(sizes[i - 1]) + " (ascending, no repeats)");
    }
  }
  const std::uint32_t most = config().max_position_embeddings;
  if (options.max_length == 0 || options.max_length > most) {
    return Status::InvalidArgument(
        "decode graphs: max_length " + std::to_string(options.max_length) +
        " is outside [1, max_position_embeddings " + std::to_string(most) + "]");
  }
  KVVM_RETURN_IF_ERROR(check_view(options.kv, "decode graphs: the KvView"));
  if (cublas_workspace_ == nullptr) {
    // Without a workspace of ours cuBLAS would allocate inside the capture.
    return Status::FailedPrecondition("decode graphs: cuBLAS has no workspace set");
  }

  std::vector<DecodeGraph> made;
  Status status = Status::Ok();
  for (const std::uint32_t rows : sizes) {
    cudaGraphExec_t exec = nullptr;
    status = capture_one(rows, options, &exec);
    if (!status.ok()) break;
    made.push_back({rows, exec});
  }
  if (!status.ok()) {
    for (const DecodeGraph& graph : made) (void)cudaGraphExecDestroy(graph.exec);
    return status.with_context("decode graphs");
  }
  graphs_ = std::move(made);
  graph_view_ = options.kv;
  graph_pad_slot_ = options.pad_slot;
  graph_max_length_ = options.max_length;
  return Status::Ok();
}

Status CudaModel::capture_one(std::uint32_t rows, const DecodeGraphOptions& options,
                              cudaGraphExec_t* exec) {
  // A decode-only batch of `rows` padding rows: only its shape is captured.
  const std::vector<std::int32_t> ids(rows, 0);
  const std::vector<Chunk> chunks(rows, Chunk{options.pad_slot, 0, 1});
  const std::vector<ChunkSampling> sampling(rows);
  const StepBatch batch{ids, chunks, options.kv, sampling};
  KVVM_RETURN_IF_ERROR(cuda_call("cudaSetDevice", cudaSetDevice(device_)));
  // Earlier work must not be recorded, and nothing queued may still read the staging block.
  KVVM_RETURN_IF_ERROR(cuda_call("cudaStreamSynchronize", cudaStreamSynchronize(stream_)));
  stage(batch, true);
  // The same step once eagerly first (it writes only pad_slot's first token): every kernel
  // module is loaded and cuBLAS has chosen its algorithms before the capture, and a failure
  // shows here, outside it. The logit-transform, token-mask and log-probability kernels are
  // captured whether or not a row needs them: their rows say whether they do when the graph
  // replays.
  KVVM_RETURN_IF_ERROR(copy_arrays());
  KVVM_RETURN_IF_ERROR(enqueue_step(batch, true, options.max_length, true, true, true));
  KVVM_RETURN_IF_ERROR(cuda_call("cudaStreamSynchronize", cudaStreamSynchronize(stream_)));
  KVVM_RETURN_IF_ERROR(cuda_call(
      "cudaStreamBeginCapture", cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal)));
  const Status enqueued = enqueue_step(batch, true, options.max_length, true, true, true);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  if (!enqueued.ok() || ended != cudaSuccess) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // an invalidated capture's error is not sticky: clear it
    if (!enqueued.ok()) return enqueued.with_context("capturing batch " + std::to_string(rows));
    return cuda_call("cudaStreamEndCapture", ended)
        .with_context("capturing batch " + std::to_string(rows));
  }
  const cudaError_t instantiated = cudaGraphInstantiate(exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  if (instantiated != cudaSuccess) {
    (void)cudaGetLastError();
    *exec = nullptr;
    return cuda_call("cudaGraphInstantiate", instantiated)
        .with_context("capturing batch " + std::to_string(rows));
  }
  const cudaError_t uploaded = cudaGraphUpload(*exec, stream_);
  if (uploaded != cudaSuccess) {
    (void)cudaGraphExecDestroy(*exec);
    *exec = nullptr;
    return cuda_call("cudaGraphUpload", uploaded)
        .with_context("capturing batch " + std::to_string(rows));
  }
  return Status::Ok();
}

const CudaModel::DecodeGraph* CudaModel::graph_for(const StepBatch& batch) const {
  if (graphs_.empty() || batch.chunks.size() > graphs_.back().batch) return nullptr;
  if (!same_view(batch.kv, graph_view_)) return nullptr;
  for (const Chunk& chunk : batch.chunks) {
    if (chunk.tokens != 1 || std::uint64_t{chunk.start} + 1 > graph_max_length_) return nullptr;
  }
  for (const DecodeGraph& graph : graphs_) {
    if (graph.batch >= batch.chunks.size()) return &graph;
  }
  return nullptr;
}

void CudaModel::stage_padding(std::uint32_t count, std::uint32_t rows, std::uint32_t pad_slot) {
  auto* sampling = reinterpret_cast<SamplingRow*>(staging_ + offsets_.sampling);
  for (std::uint32_t r = count; r < rows; ++r) {
    staging_[offsets_.ids + r] = 0;
    staging_[offsets_.positions + r] = 0;
    staging_[offsets_.row_slots + r] = pad_slot;
    staging_[offsets_.decode_slots + r] = pad_slot;
    staging_[offsets_.decode_lengths + r] = 1;
    staging_[offsets_.last_rows + r] = r;
    sampling[r] = SamplingRow{};
    reinterpret_cast<LogprobRow*>(staging_ + offsets_.logprob_rows)[r] = LogprobRow{};
    reinterpret_cast<LogitAdjustRow*>(staging_ + offsets_.adjust_rows)[r] = LogitAdjustRow{};
    reinterpret_cast<std::int32_t*>(staging_ + offsets_.mask_rows)[r] = -1;
  }
}

// REQUIRES: stage(batch) ran (a decode-only batch: row r is chunk r).
Status CudaModel::replay(const DecodeGraph& graph, const StepBatch& batch, const StepOutput& out) {
  const auto count = static_cast<std::uint32_t>(batch.chunks.size());
  stage_padding(count, graph.batch, graph_pad_slot_);
  KVVM_RETURN_IF_ERROR(copy_arrays());
  KVVM_RETURN_IF_ERROR(cuda_call("cudaGraphLaunch", cudaGraphLaunch(graph.exec, stream_)));
  ++replays_;
  return finish_step(batch, out, count);
}

}  // namespace kvvm::model::detail
