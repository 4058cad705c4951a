// Tile sizes of the flash kernels compared in one process, call by call: every round times one
// forward and one backward of each configuration in turn, so that a shared machine's load falls on
// all of them alike. Prints, per configuration, the median and the best time and the median over
// the rounds of (first configuration's time / this one's): above 1 is faster than the first.
//
//   bench_attention_tiles --n 128 --d 32 --batch 32 --heads 8 --mask causal --precision bf16
//       --threads 2 --rounds 41 0x0 64x64 32x96
//
// A configuration is QxK (query rows × keys per tile); 0 means the kernel's default for that side.
#include "cabm/core/tensor.h"
#include "cabm/core/threads.h"
#include "cabm/kernels/attention/flash.h"
#include "cabm/kernels/attention/flash_bf16.h"
#include "cabm/kernels/bf16.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

cabm::Tensor random_tensor(const cabm::Shape& shape, std::mt19937& rng) {
  cabm::Tensor t = cabm::Tensor::empty(shape);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(rng);
  return t;
}

int usage(const char* why) {
  std::fprintf(stderr,
               "bench_attention_tiles: %s\nusage: bench_attention_tiles [--n N] [--d D] [--batch B] [--heads H] "
               "[--mask none|causal] [--precision fp32|bf16] [--threads T] [--rounds R] QxK...\n",
               why);
  return 2;
}

// Times every configuration once per round, in turn, and prints the table.
void run(int64_t N, int64_t d, int64_t B, int64_t H, const std::string& mask, const std::string& precision,
         int64_t rounds, const std::vector<cabm::FlashConfig>& configs, const std::vector<std::string>& names) {
  const bool bf16 = precision == "bf16";
  std::mt19937 rng(1);
  cabm::Tensor q = random_tensor({B, N, H, d}, rng), k = random_tensor({B, N, H, d}, rng),
               v = random_tensor({B, N, H, d}, rng), dout = random_tensor({B, N, H, d}, rng);
  if (bf16) q = cabm::rounded_to_bf16(q), k = cabm::rounded_to_bf16(k), v = cabm::rounded_to_bf16(v);
  cabm::AttentionOptions options;
  if (mask == "causal") options.mask = cabm::Mask::causal();
  const size_t C = configs.size();
  std::vector<cabm::Tensor> out(C), lse(C), dq(C), dk(C), dv(C);
  for (size_t c = 0; c < C; ++c) {
    out[c] = cabm::Tensor::zeros({B, N, H, d}), lse[c] = cabm::Tensor::zeros({B, H, N});
    dq[c] = cabm::Tensor::zeros({B, N, H, d}), dk[c] = cabm::Tensor::zeros({B, N, H, d});
    dv[c] = cabm::Tensor::zeros({B, N, H, d});
  }
  std::vector<std::vector<double>> fwd(C), bwd(C);
  for (int64_t r = -2; r < rounds; ++r) {  // two rounds of warm-up
    for (size_t c = 0; c < C; ++c) {
      const auto t0 = Clock::now();
      if (bf16)
        cabm::attention_flash_bf16_forward(q, k, v, options, out[c], &lse[c], configs[c]);
      else
        cabm::attention_flash_forward(q, k, v, options, out[c], &lse[c], configs[c]);
      const auto t1 = Clock::now();
      const cabm::AttentionSaved saved{q, k, v, out[c], lse[c]};
      const cabm::AttentionGrads grads{dq[c], dk[c], dv[c]};
      if (bf16)
        cabm::attention_flash_bf16_backward(saved, dout, options, grads, configs[c]);
      else
        cabm::attention_flash_backward(saved, dout, options, grads, configs[c]);
      const auto t2 = Clock::now();
      if (r >= 0) {
        fwd[c].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        bwd[c].push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
      }
    }
  }
  std::printf("%s N %ld d %ld B %ld H %ld mask %s threads %d rounds %ld path %s\n", precision.c_str(), (long)N, (long)d,
              (long)B, (long)H, mask.c_str(), cabm::num_threads(), (long)rounds,
              bf16 ? cabm::attention_flash_bf16_path() : "fp32");
  std::printf("%-10s %10s %10s %10s %10s %10s %10s\n", "config", "fwd_med", "fwd_min", "fwd_ratio", "bwd_med",
              "bwd_min", "bwd_ratio");
  for (size_t c = 0; c < C; ++c) {
    std::vector<double> rf, rb;
    for (int64_t r = 0; r < rounds; ++r) {
      rf.push_back(fwd[0][r] / fwd[c][r]);
      rb.push_back(bwd[0][r] / bwd[c][r]);
    }
    std::printf("%-10s %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f\n", names[c].c_str(), median(fwd[c]),
                *std::min_element(fwd[c].begin(), fwd[c].end()), median(rf), median(bwd[c]),
                *std::min_element(bwd[c].begin(), bwd[c].end()), median(rb));
  }
}

}  // namespace

int main(int argc, char** argv) {
  int64_t N = 128, d = 32, B = 32, H = 8, threads = 0, rounds = 31;
  std::string mask = "causal", precision = "bf16";
  std::vector<cabm::FlashConfig> configs;
  std::vector<std::string> names;
  const std::pair<const char*, int64_t*> int_flags[] = {
      {"--n", &N}, {"--d", &d}, {"--batch", &B}, {"--heads", &H}, {"--threads", &threads}, {"--rounds", &rounds}};
  const std::pair<const char*, std::string*> text_flags[] = {{"--mask", &mask}, {"--precision", &precision}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    bool flag = false;
    for (const auto& [name, target] : int_flags)
      if (a == name) {
        if (i + 1 == argc) return usage((a + " needs a value").c_str());
        *target = std::atol(argv[++i]);
        flag = true;
      }
    for (const auto& [name, target] : text_flags)
      if (a == name) {
        if (i + 1 == argc) return usage((a + " needs a value").c_str());
        *target = argv[++i];
        flag = true;
      }
    if (flag) continue;
    long q = 0, k = 0;
    if (std::sscanf(a.c_str(), "%ldx%ld", &q, &k) != 2 || q < 0 || k < 0) return usage(("bad argument " + a).c_str());
    cabm::FlashConfig c;
    c.block_q = q, c.block_k = k;
    configs.push_back(c);
    names.push_back(a);
  }
  if (configs.empty()) return usage("no configurations");
  if (N < 1 || d < 1 || B < 1 || H < 1 || rounds < 1) return usage("sizes and rounds must be positive");
  if (mask != "none" && mask != "causal") return usage("--mask must be none or causal");
  if (precision != "fp32" && precision != "bf16") return usage("--precision must be fp32 or bf16");
  if (threads > 0) cabm::set_num_threads(static_cast<int>(threads));

  try {
    run(N, d, B, H, mask, precision, rounds, configs, names);
  } catch (const std::exception& e) {  // a kernel's check (a tile size it does not take, say)
    std::fprintf(stderr, "bench_attention_tiles: %s\n", e.what());
    return 1;
  }
  return 0;
}
