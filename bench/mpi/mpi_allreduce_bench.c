/* The MPI peer of `cortado bench pushpull`: MPI_Allreduce (sum, float32) over
 * the same sizes and iteration counts, printing the same JSON fields from
 * rank 0. bench/compare_pushpull.py runs it under mpirun with the shared
 * memory BTL and with `--mca btl tcp,self`. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int itersFor(uint64_t bytes, int requested) {
  if (requested > 0) return requested;
  uint64_t it = (1ull << 30) / (bytes ? bytes : 1);
  if (it < 5) it = 5;
  if (it > 200) it = 200;
  return (int)it;
}

int main(int argc, char** argv) {
  uint64_t minBytes = 4096, maxBytes = 256ull << 20;
  int iters = 0, warmup = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--min-bytes")) minBytes = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--max-bytes")) maxBytes = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--warmup")) warmup = atoi(argv[i + 1]);
    else {
      fprintf(stderr, "mpi_allreduce_bench: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (uint64_t bytes = minBytes; bytes <= maxBytes; bytes *= 2) {
    uint64_t n = bytes / 4 ? bytes / 4 : 1;
    float* in = malloc(n * 4);
    float* out = malloc(n * 4);
    for (uint64_t i = 0; i < n; ++i) in[i] = (float)((rank + 1) * (int)(i % 13 + 1));
    for (int i = 0; i < warmup; ++i) MPI_Allreduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    int it = itersFor(bytes, iters);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < it; ++i) MPI_Allreduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double secs = (MPI_Wtime() - t0) / it;
    int wrong = 0;
    for (uint64_t i = 0; i < n; ++i)
      wrong |= out[i] != (float)(size * (size + 1) / 2 * (int)(i % 13 + 1));
    int anyWrong = 0;
    MPI_Allreduce(&wrong, &anyWrong, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    if (rank == 0) {
      double algbw = (double)(n * 4) / secs / 1e9;
      printf("{\"size_bytes\": %llu, \"seconds\": %.9f, \"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f, "
             "\"ok\": %s, \"iters\": %d}\n",
             (unsigned long long)(n * 4), secs, algbw, algbw * 2.0 * (size - 1) / size,
             anyWrong ? "false" : "true", it);
      fflush(stdout);
    }
    free(in);
    free(out);
  }
  MPI_Finalize();
  return 0;
}
