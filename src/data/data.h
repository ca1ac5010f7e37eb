/* data.h — datasets and loaders (internal API used by the training session).
 *
 * A dataset is n examples held in memory, each an x (features) and a y
 * (label or target) of fixed per-example shape. Loaders cut it into batches
 * in an order that depends only on (seed, epoch): reruns see the same data
 * in the same order, and a run resumed at a loader position continues
 * exactly where it stopped.
 *
 *     ts_dataset *all, *train, *val;
 *     ts_status s = ts_data_load_idx_pair("train-images-idx3-ubyte.gz",
 *                                         "train-labels-idx1-ubyte.gz", &all);
 *     s = ts_dataset_split(all, 0.1, seed, &train, &val);   // 10 % validation
 *     ts_loader *ld;
 *     s = ts_loader_new(train, 64, 1, seed, &ld);          // batch 64, shuffled
 *     float x[64 * 784]; int64_t y[64];
 *     s = ts_loader_next(ld, x, y);                        // wraps into the next epoch
 *
 * Formats: .npy arrays, IDX files (plain or gzip), CSV time series with
 * sliding windows, raw token files (uint16/uint32). Every file read is
 * recorded with its SHA-256 in the dataset's lineage list.
 */
#ifndef TS_DATA_H
#define TS_DATA_H

#include <stdint.h>
#include <stdio.h>
#include "tessel/data.h"
#include "tessel/graph.h"

typedef struct ts_token_map ts_token_map; /* src/data/tokmap.c */

typedef struct ts_dataset {
    int64_t n; /* examples */
    ts_dtype x_dtype, y_dtype;
    int x_rank, y_rank; /* per example (y_rank 0: a scalar label) */
    int64_t x_dims[TS_MAX_RANK], y_dims[TS_MAX_RANK];
    void *x, *y; /* n * example bytes each, owned */
    ts_lineage *lineage;
    int n_lineage;
    /* CSV normalisation: per-feature mean/std used (NULL otherwise), so the
     * run directory can record them. */
    float *norm_mean, *norm_std;
    int64_t n_norm;
    /* A mapped token file (ts_data_map_tokens): x and y are NULL and each
     * example is cut from the mapping when a loader assembles a batch;
     * example i is window index[i] (index NULL: window i). Shared, counted. */
    ts_token_map *tokens;
    int64_t *index;
    /* A mapped .npy or IDX x (ts_data_map_npy_pair, ts_data_map_idx_pair):
     * x is NULL and example i's x is element index[i] (index NULL: i) of
     * the mapping, widened to f32 when a loader assembles a batch; y is in
     * memory as usual. Shared, counted. */
    struct ts_xmap *xmap;
    /* Token windows (mapped or in memory): a shuffled loader orders them by
     * a keyed bijection computed per position, not by a Fisher-Yates
     * permutation of all n drawn before the first batch (order.c). */
    int shuffle_bijection;
    /* Per-example flags (data.valid: which sources an example has), u8
     * [n, valid_cols] in memory, indexed like y; NULL when there are none.
     * A loader or ts_dataset_read writes a batch's flags after its y
     * (ts_dataset_attach_valid). */
    uint8_t *valid;
    int64_t valid_cols;
} ts_dataset;

void ts_dataset_free(ts_dataset *d);
size_t ts_dataset_x_bytes(const ts_dataset *d); /* bytes of one example's x */
size_t ts_dataset_y_bytes(const ts_dataset *d);

/* The largest class count a class id read from data may imply when
 * model.classes is left to the data: that key's documented maximum (1e9). */
#define TS_DATA_MAX_CLASSES ((int64_t)1000000000)

/* ---- readers (errors name the file and what is wrong) ------------------- */

/* .npy and IDX arrays: ts_data_read_npy, ts_data_read_idx (tessel/data.h). */

/* Images + labels of the same count: x scaled to [0, 1] f32 and flattened
 * ([n, rows*cols]), y i64 class ids (y_rank 0). Lineage: images, labels. */
ts_status ts_data_load_idx_pair(const char *images, const char *labels, ts_dataset **out);
/* Two .npy files: x [n, ...] (to f32), y [n, ...] (f32, or i64 for integer
 * labels); the leading axis is the example axis. Lineage: x, y. */
ts_status ts_data_load_npy_pair(const char *x_path, const char *y_path, ts_dataset **out);

/* The same data sets (same examples, values, checks, messages and lineage)
 * without copying x: the file is memory-mapped, hashed and checked in one
 * pass that hands its pages back as it goes, and a loader widens each
 * batch's examples to f32 as it assembles them (x NULL, xmap set; y is
 * read into memory). A gzip IDX file cannot be mapped: its images are
 * inflated into memory as bytes (a quarter of the f32 copy) and widened per
 * batch the same way. A split gives two parts that read the mapping (an
 * index of examples each; y copied). */
ts_status ts_data_map_idx_pair(const char *images, const char *labels, ts_dataset **out);
ts_status ts_data_map_npy_pair(const char *x_path, const char *y_path, ts_dataset **out);

/* Per-example flags from a .npy file (data.valid, src/data/valid.c): an
 * array [d->n, cols] of 0s and 1s of any integer or float dtype becomes
 * d->valid (u8), its SHA-256 joins d's lineage. Another shape, a value
 * other than 0 or 1, or a missing file fail naming the file (and the
 * example and column of a bad value). Splits copy the flags with the
 * examples; from then on a batch's flags follow its y: a loader or
 * ts_dataset_read of count examples writes count * y bytes of targets,
 * then count * cols bytes of flags, so its y buffer must hold both.
 *
 *     ts_data_map_npy_pair("x.npy", "y.npy", &d);
 *     ts_dataset_attach_valid(d, "valid.npy", 3);   // [n, 3]
 */
ts_status ts_dataset_attach_valid(ts_dataset *d, const char *path, int64_t cols);

typedef struct ts_csv_options {
    const char *path;
    const char *const *features; /* column names used as features (NULL: all but label) */
    int n_features;
    const char *label;  /* column predicted */
    int64_t window;     /* rows per example */
    int64_t horizon;    /* label taken `horizon` rows after the window's last row */
    int normalise;      /* standardise features with statistics of the first train_rows */
    int64_t train_rows; /* rows whose statistics are used (0: all) */
    int64_t skip_rows;  /* lines skipped before the header (or the first row) */
    int no_header;      /* 1: no header line; columns are named "0", "1", ... */
    int64_t classes;    /* > 0: the label is a class id in [0, classes): y i64, y_rank 0 */
} ts_csv_options;
/* x [window, n_features] f32, y [1] f32. Rows are the data lines after the
 * header (blank lines skipped); example i takes rows [i, i + window) and the
 * label of row i + window - 1 + horizon (horizon >= 0), so
 * n = rows - window - horizon + 1. Features may include the label column.
 * Normalisation changes x only (y keeps its units); a feature with std 0
 * gets std 1. A cell that is not a number is an error "FILE:LINE: column
 * 'NAME' holds 'abc', not a number" (LINE counts the header as line 1); an
 * unknown column is an error listing the columns there are. */
ts_status ts_data_load_csv_windows(const ts_csv_options *o, ts_dataset **out);

/* Standardises x of `train` and of others[0..n) in place with each
 * feature's (last axis of x) mean and population std over `train` only (a
 * constant feature gets std 1), recording them in each dataset's
 * norm_mean / norm_std. The datasets must have the same f32 x shape. */
ts_status ts_dataset_standardise(ts_dataset *train, ts_dataset *const *others, int n);

/* A raw token file (little-endian uint16 or uint32, bits = 16 or 32): example
 * k is the window of ctx + 1 tokens starting at token k * ctx (windows share
 * one token, so every token but the first is a target exactly once);
 * x = first ctx, y = next ctx (i64); n = (tokens - 1) / ctx. A token >= vocab
 * is an error naming its byte offset and value. */
/* The same file as documents, each ending with the end-of-text id `eot`
 * (a last document without one ends with the file): example k is one
 * document, or one piece of ctx + 1 tokens of a longer one (pieces share a
 * token, like the windows above), x its tokens but the last and y the
 * next-token targets, both padded to ctx (x with eot, y with -100), so no
 * example crosses a document. Pieces of fewer than 2 tokens are left out. */
ts_status ts_data_load_token_docs(const char *path, int bits, int64_t ctx, int64_t vocab,
                                  int64_t eot, ts_dataset **out);
/* The same with the documents' boundaries from `offsets` (data.doc_offsets),
 * when not NULL: a text file of token offsets, whole numbers separated by
 * white space, the first 0, increasing, each the start of a document that
 * runs to the next (the last to the end of the file); padded inputs hold
 * token 0 and eot is not read. The offsets file joins the lineage. */
ts_status ts_data_load_token_docs_at(const char *path, int bits, int64_t ctx, int64_t vocab,
                                     int64_t eot, const char *offsets, ts_dataset **out);
ts_status ts_data_load_tokens(const char *path, int bits, int64_t ctx, int64_t vocab,
                              ts_dataset **out);
/* The same examples, same checks and same lineage without copying the file:
 * it is memory-mapped and a loader widens each batch's windows to i64 as it
 * assembles them (x and y stay NULL, d->tokens is set). Resident memory
 * stays far below the file's size. A split of it gives two parts that map
 * the same file (an index of windows each); evaluation reads the validation
 * windows batch by batch (ts_dataset_read). */
ts_status ts_data_map_tokens(const char *path, int bits, int64_t ctx, int64_t vocab,
                             ts_dataset **out);
/* ts_data_map_tokens without waiting for the pass that hashes the file and
 * checks every token: a thread does it while training starts, and the
 * lineage's SHA-256 fields stay "" until ts_dataset_lineage_wait. Windows
 * read before are checked against the vocabulary one by one (a bad token
 * is a loader error with the pass's message). Sizes are checked here. */
ts_status ts_data_map_tokens_async(const char *path, int bits, int64_t ctx, int64_t vocab,
                                   ts_dataset **out);
/* 1 while the hashing pass of d (as returned by ts_data_map_tokens_async)
 * runs; 0 once ts_dataset_lineage_wait will not block, and for any other
 * data set. */
int ts_dataset_lineage_pending(const ts_dataset *d);
/* Waits for d's hashing pass and fills its lineage's SHA-256 fields; its
 * error (a token not below the vocabulary, a file changed while hashed, a
 * read error) otherwise, again at every call. TS_OK at once for other data
 * sets. Parts split off before it returned keep empty hashes: wait on the
 * data set the reader returned. */
ts_status ts_dataset_lineage_wait(ts_dataset *d);

/* ---- graphs (src/data/graph.c) ------------------------------------------- */

/* An undirected graph's edge list as read from a file. */
typedef struct ts_edge_list {
    int64_t n;          /* edges */
    int64_t *src, *dst; /* [n] each, node ids in [0, nodes) */
    ts_lineage lineage;
} ts_edge_list;
/* Reads an edge list: one edge per line, two node ids separated by a comma,
 * tab or spaces ("12,40", "12\t40", "12 40"); '#' starts a comment (a whole
 * line or the rest of one); blank lines and CRLF line ends are fine; the
 * first line that is not a comment may be a header (cells that are not
 * integers, e.g. "src,dst"). Errors name FILE:LINE: a line without exactly
 * two cells, a cell that is not an integer, a node id outside [0, nodes), a
 * self loop ("node 3 joined to itself": the normalisation adds every self
 * loop once, so a listed one would count twice), and an edge listed twice
 * in the same direction (naming both lines). The same pair listed in both
 * directions is one undirected edge and is fine (many files list both). */
ts_status ts_data_read_edges(const char *path, int64_t nodes, ts_edge_list *out);
void ts_edge_list_free(ts_edge_list *e);

/* A node-classification graph: edges, node features and node labels. */
typedef struct ts_graph_data {
    int64_t nodes, features, classes;
    float *x;   /* [nodes, features] */
    int64_t *y; /* [nodes], class ids in [0, classes) */
    ts_edge_list edges;
    ts_lineage x_lineage, y_lineage;
} ts_graph_data;
/* features: .npy [nodes, F] (converted to f32); labels: .npy of integers
 * [nodes]; classes 0 means the largest label plus one. nodes is the
 * features' row count; a label count that differs, a label outside
 * [0, classes) (naming the node) and the edge errors above are errors. */
ts_status ts_data_load_graph(const char *edges, const char *features, const char *labels,
                             int64_t classes, ts_graph_data *out);
void ts_graph_data_free(ts_graph_data *g);

/* ---- splits and loaders -------------------------------------------------- */

/* Deterministic split: a Philox Fisher-Yates permutation keyed by seed; its
 * last round(val_fraction * n) entries go to val (0 <= val_fraction < 1; val
 * may be empty, train may not). Each part keeps the examples' original
 * relative order. The parts own copies (lineage and normalisation
 * statistics included); `all` is unchanged. Of mapped data (tokens, .npy,
 * IDX) both parts are views sharing the mapping: x (and a token file's y)
 * stays NULL, and ts_dataset_read or a loader reads the examples. */
ts_status ts_dataset_split(const ts_dataset *all, double val_fraction, uint64_t seed,
                           ts_dataset **train, ts_dataset **val);

/* Examples [first, first + count) of d, in order, into x and y (count
 * examples' bytes each): the same values whether d is in memory or mapped.
 * A mapped token window holding a token outside the vocabulary is an
 * error; what reading mapped examples brought into memory is dropped as
 * it goes (resident memory stays small whatever count is). A data set with
 * flags (d->valid) writes count * valid_cols bytes of them after the
 * targets: y holds both.
 *
 *     ts_dataset_read(val, start, batch, bx, by);   // evaluation's batch */
ts_status ts_dataset_read(const ts_dataset *d, int64_t first, int64_t count, void *x, void *y);

/* The permutation of [0, n) that ts_dataset_split draws for `seed` (its
 * last entries are the validation examples), for callers that split
 * something other than a dataset's examples (a graph's nodes). */
ts_status ts_data_split_permutation(int64_t n, uint64_t seed, int64_t *perm);

typedef struct ts_loader ts_loader;
/* Batches of `batch` examples; shuffle: a fresh permutation per epoch from
 * (seed, epoch); no shuffle: file order. The last partial batch of an epoch
 * is dropped (a plan's shapes are static). Fails if the dataset has fewer
 * than `batch` examples. The loader borrows `d`: keep it alive until
 * ts_loader_free. */
ts_status ts_loader_new(const ts_dataset *d, int64_t batch, int shuffle, uint64_t seed,
                        ts_loader **out);
/* Copy the next batch into x and y (batch * example bytes each; a data set
 * with flags, d->valid, adds batch * valid_cols bytes of them to y after
 * the targets, row j's at batch * y bytes + j * valid_cols). */
ts_status ts_loader_next(ts_loader *l, void *x, void *y);
/* Keep each epoch's short last batch (data.drop_last false): an epoch is
 * ceil(n / batch) batches, the last one holding n % batch examples (when
 * that is not 0). Call before the first batch. */
void ts_loader_keep_last(ts_loader *l);
/* Token sequences of several lengths (targets -100 past the end): each
 * window of `batches` batches of an epoch's order is sorted by length
 * (ties by position), so a batch's sequences are alike and pad little;
 * the order stays a pure function of (seed, epoch). Call before the first
 * batch. */
ts_status ts_loader_sort_window(ts_loader *l, int64_t batches);
/* ts_loader_next, also saying how many examples the batch holds (*rows;
 * batch except for a kept short last batch, whose remaining rows of x and y
 * are left untouched). */
ts_status ts_loader_next_rows(ts_loader *l, void *x, void *y, int64_t *rows);
int64_t ts_loader_epoch(const ts_loader *l);    /* 0-based epoch of the next batch */
int64_t ts_loader_position(const ts_loader *l); /* batches handed out so far */
int64_t ts_loader_batches_per_epoch(const ts_loader *l);
/* Jump to a position (resume): the next batch is the one a fresh loader
 * would return after `batches` calls. */
ts_status ts_loader_seek(ts_loader *l, int64_t batches);
/* Assemble the next `depth` batches on a background thread while the
 * caller works (0: none, the default; at most 64). The batches and their
 * order are exactly those without prefetch; a seek or a new depth drops
 * what was prefetched. The thread starts here (and again on the first
 * ts_loader_next after a seek). */
ts_status ts_loader_prefetch(ts_loader *l, int depth);
/* Seconds ts_loader_next has spent waiting for a prefetched batch so far. */
double ts_loader_wait_seconds(const ts_loader *l);
void ts_loader_free(ts_loader *l);

#endif
