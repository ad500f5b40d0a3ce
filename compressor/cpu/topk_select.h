// Exact top-k selection by magnitude for the top-k and DGC codecs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compressor/codec.h"

namespace cortado {
class ThreadPool;
}

namespace cortado::compressor::cpu {

// Writes to indices[0..k) the k indices of the largest |x[i]|, ties broken
// toward the lower index, in ascending order. Magnitudes compare as the bit
// patterns of |x| (so NaN ranks above inf, identically on CPU and GPU).
//
// How: a sample of `sampleCount` elements (cache-line runs at hashed places)
// gives two bars: a low one that a few more than k elements reach, and a
// high one that a few fewer than k exceed. One parallel scan (AVX2, lanes
// left-packed without branches) copies the candidates, key >= the low bar,
// with their values, in index order. Those above the high bar are kept for
// sure; nth_element over the keys of the narrow band between the bars finds
// the exact k-th magnitude, and a last pass over the candidates writes the
// indices and values out. If the sample overshot (fewer than k candidates)
// the low bar is lowered and the scan repeated, down to the whole tensor; if
// it undershot (k or more above the high bar) the selection runs over every
// candidate; so the result is always exact. Ties at the low bar (few
// distinct magnitudes) and a zero bar (sparse input, e.g. a re-encoded
// sparse sum: only the non-zeros are collected) are resolved in one pass,
// lowest indices first, without a selection among the tied candidates.
// The calling thread keeps its candidate arrays for the next call (up to
// 64 MiB in all).
void selectTopK(const float* x, size_t n, size_t k, size_t sampleCount, ThreadPool* pool,
                uint32_t* indices);

// The same selection over n little-endian f32 at any address, writing the k
// indices (u32) to `indices` and, unless null, their values (the f32 bits
// as they are) to `values`, both little-endian at any address: a top-k
// payload's body, without a gather pass of its own.
void selectTopK(const std::byte* x, size_t n, size_t k, size_t sampleCount, ThreadPool* pool,
                std::byte* indices, std::byte* values);

// The same selection over up.e after error feedback's update (codec.h,
// FeedbackUpdate), which the first scan applies as it reads each element
// (the sample computes its elements' updated values without storing them):
// up.e, up.u and the output are bit for bit those of the update's own pass
// followed by selectTopK over up.e, one pass over the state fewer. Where no
// sample is taken (small tensors, k >= n) the update runs on its own first.
void selectTopKUpdating(const FeedbackUpdate& up, size_t n, size_t k, size_t sampleCount,
                        ThreadPool* pool, std::byte* indices, std::byte* values);

// The vector code of the scan and the output pass: AVX2 where the CPU has
// it, unless set to the portable loops, which the tests do to check both
// against the reference (both give the same result). setSelectTopKIsa
// clamps to what the CPU supports and returns what is used; process-wide.
enum class SelectIsa { kScalar, kAvx2 };
SelectIsa selectTopKIsa();
SelectIsa setSelectTopKIsa(SelectIsa isa);

}  // namespace cortado::compressor::cpu
