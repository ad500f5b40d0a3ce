// Exact top-k selection by magnitude for the top-k and DGC codecs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cortado {
class ThreadPool;
}

namespace cortado::compressor::cpu {

// Writes to indices[0..k) the k indices of the largest |x[i]|, ties broken
// toward the lower index, in ascending order. Magnitudes compare as the bit
// patterns of |x| (so NaN ranks above inf, identically on CPU and GPU).
//
// How: a sample of `sampleCount` elements (cache-line runs at hashed places)
// gives a threshold that a few more than k elements pass; one parallel scan
// collects those candidates in index order; nth_element on the candidates'
// keys finds the exact k-th magnitude. If the sample overshot (fewer than k
// candidates), the threshold is lowered and the scan repeated, down to the
// whole tensor, so the result is always exact. Ties at the threshold (few
// distinct magnitudes) and a zero threshold (sparse input, e.g. a re-encoded
// sparse sum: only the non-zeros are collected) are resolved in one pass,
// lowest indices first, without a selection among the tied candidates.
void selectTopK(const float* x, size_t n, size_t k, size_t sampleCount, ThreadPool* pool,
                uint32_t* indices);

}  // namespace cortado::compressor::cpu
