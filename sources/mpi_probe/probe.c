/*
 * sitestack-mpi-probe: MPI latency and bandwidth between the first and the last rank, an
 * MPI_Allreduce correctness check over all ranks, and the MPI library's version string.
 *
 * Built against the site MPI, it tells MPI problems apart from NCCL/RCCL problems in the
 * validation job. Rank 0 prints JSON (to stdout, or to the file given with --json):
 *   {"library": "...", "size": 2, "hosts": ["nid001", "nid002"], "latency_us": 1.9,
 *    "bandwidth": [{"bytes": 1024, "mb_s": 850.2}, ...], "allreduce_ok": true}
 *
 * Usage: sitestack-mpi-probe [--json FILE] [--max-bytes N] [--iters N]
 * Latency: 8-byte ping-pong, half the round trip. Bandwidth: osu_bw style, a window of
 * non-blocking sends from rank 0 to the last rank, one acknowledgement per window.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW 32
#define TAG 11

static void json_string(FILE *out, const char *text) {
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)text; *p; ++p) {
        switch (*p) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\t': fputs("\\t", out); break;
        case '\r': break;
        default:
            if (*p < 0x20) fprintf(out, "\\u%04x", *p);
            else fputc(*p, out);
        }
    }
    fputc('"', out);
}

static double latency_us(int rank, int peer, int iters) {
    char buf[8] = {0};
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (int i = 0; i < iters; ++i) {
        if (rank == 0) {
            MPI_Send(buf, 8, MPI_CHAR, peer, TAG, MPI_COMM_WORLD);
            MPI_Recv(buf, 8, MPI_CHAR, peer, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == peer) {
            MPI_Recv(buf, 8, MPI_CHAR, 0, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, 8, MPI_CHAR, 0, TAG, MPI_COMM_WORLD);
        }
    }
    return (MPI_Wtime() - start) / iters / 2 * 1e6;
}

static double bandwidth_mb_s(int rank, int peer, char *buf, int bytes, int iters) {
    MPI_Request req[WINDOW];
    char ack = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (int i = 0; i < iters; ++i) {
        if (rank == 0) {
            for (int w = 0; w < WINDOW; ++w)
                MPI_Isend(buf, bytes, MPI_CHAR, peer, TAG, MPI_COMM_WORLD, &req[w]);
            MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
            MPI_Recv(&ack, 1, MPI_CHAR, peer, TAG + 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == peer) {
            for (int w = 0; w < WINDOW; ++w)
                MPI_Irecv(buf, bytes, MPI_CHAR, 0, TAG, MPI_COMM_WORLD, &req[w]);
            MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
            MPI_Send(&ack, 1, MPI_CHAR, 0, TAG + 1, MPI_COMM_WORLD);
        }
    }
    double seconds = MPI_Wtime() - start;
    return (double)bytes * WINDOW * iters / seconds / 1e6;
}

int main(int argc, char **argv) {
    const char *json_path = NULL;
    long max_bytes = 4L << 20;
    int iters = 20;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc) max_bytes = atol(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: %s [--json FILE] [--max-bytes N] [--iters N]\n", argv[0]);
            return 0;
        } else {
            fprintf(stderr, "sitestack-mpi-probe: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (max_bytes < 1024 || max_bytes > (1L << 30) || iters < 1) {
        fprintf(stderr, "sitestack-mpi-probe: --max-bytes must be 1024..1073741824 and --iters >= 1\n");
        return 2;
    }

    MPI_Init(&argc, &argv);
    int rank, size, len;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char library[MPI_MAX_LIBRARY_VERSION_STRING];
    MPI_Get_library_version(library, &len);
    char host[MPI_MAX_PROCESSOR_NAME];
    memset(host, 0, sizeof host);
    MPI_Get_processor_name(host, &len);
    char *hosts = rank == 0 ? calloc((size_t)size, MPI_MAX_PROCESSOR_NAME) : NULL;
    MPI_Gather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, MPI_COMM_WORLD);

    long sum = 0, mine = rank;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    int allreduce_ok = sum == (long)size * (size - 1) / 2;

    int peer = size - 1;
    double lat = 0;
    int nsizes = 0;
    long sizes[32];
    double mbs[32];
    if (size >= 2) {
        latency_us(rank, peer, 50);  /* warm-up */
        lat = latency_us(rank, peer, 500);
        char *buf = malloc((size_t)max_bytes);
        if (!buf) {
            fprintf(stderr, "sitestack-mpi-probe: cannot allocate %ld bytes\n", max_bytes);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        memset(buf, 1, (size_t)max_bytes);
        for (long bytes = 1024; bytes <= max_bytes && nsizes < 32; bytes *= 4) {
            int n = bytes >= (1L << 20) ? iters : iters * 5;
            bandwidth_mb_s(rank, peer, buf, (int)bytes, 2);  /* warm-up */
            sizes[nsizes] = bytes;
            mbs[nsizes] = bandwidth_mb_s(rank, peer, buf, (int)bytes, n);
            ++nsizes;
        }
        free(buf);
    }

    int status = 0;
    if (rank == 0) {
        FILE *out = stdout;
        if (json_path && !(out = fopen(json_path, "w"))) {
            perror(json_path);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        fputs("{\"library\": ", out);
        json_string(out, library);
        fprintf(out, ", \"size\": %d, \"hosts\": [", size);
        for (int r = 0; r < size; ++r) {
            if (r) fputs(", ", out);
            json_string(out, hosts + (size_t)r * MPI_MAX_PROCESSOR_NAME);
        }
        fprintf(out, "], \"latency_us\": %.4f, \"bandwidth\": [", lat);
        for (int i = 0; i < nsizes; ++i)
            fprintf(out, "%s{\"bytes\": %ld, \"mb_s\": %.2f}", i ? ", " : "", sizes[i], mbs[i]);
        fprintf(out, "], \"allreduce_ok\": %s}\n", allreduce_ok ? "true" : "false");
        if (out != stdout) fclose(out);
        free(hosts);
        if (size < 2) {
            fprintf(stderr, "sitestack-mpi-probe: needs 2 ranks, got %d\n", size);
            status = 1;
        }
        if (!allreduce_ok) {
            fprintf(stderr, "sitestack-mpi-probe: MPI_Allreduce gave %ld, expected %ld\n", sum, (long)size * (size - 1) / 2);
            status = 1;
        }
    }
    MPI_Finalize();
    return status;
}
