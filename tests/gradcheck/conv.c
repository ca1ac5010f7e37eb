/* Gradient checks, PyTorch reference values, oneDNN-vs-reference and
 * thread-count determinism for conv and conv_transpose (1-d, 2-d, 3-d), in
 * both layouts: the channels-last runs permute x in and y out, so every
 * check compares against the same channels-first numbers. */
#include <stdlib.h>
#include <string.h>
#include "gradcheck.h"
#include "conv_cases.h"
#include "plan/plan.h"

/* A convolution (or transposed convolution) configuration. */
typedef conv_case cv;

static int rank_of(const cv *c) {
    return c->nd + 2;
}

/* The layout the checks build the op in. */
static ts_layout layout = TS_CHANNELS_FIRST;

static ts_val build_cv(ts_graph *g, const ts_val *in, void *u) {
    const cv *c = u;
    ts_val b = c->bias ? in[2] : TS_NONE;
    int r = rank_of(c), cl = layout == TS_CHANNELS_LAST;
    ts_val x = cl ? gc_to_layout(g, in[0], r, 1) : in[0], y;
    if (c->transpose)
        y = ts_conv_transpose_layout(g, x, in[1], b, c->nd, c->s, c->p, c->op, c->groups, layout);
    else
        y = ts_conv_layout(g, x, in[1], b, c->nd, c->s, c->p, c->d, c->groups, layout);
    return cl ? gc_to_layout(g, y, r, 0) : y;
}

static const char *layout_name(void) {
    return layout == TS_CHANNELS_LAST ? " (channels last)" : "";
}

/* Output channels of a configuration (the bias length). */
static int64_t out_channels(const cv *c) {
    return c->transpose ? c->w[1] * c->groups : c->w[0];
}

#define NCONFIGS n_conv_cases

static void gradchecks(void) {
    for (int i = 0; i < NCONFIGS; i++) {
        const cv *c = &conv_cases[i];
        gc_input in[3] = {{TS_F64, rank_of(c), {0}, 1, 0, 0, NULL},
                          {TS_F64, rank_of(c), {0}, 1, 0, 0, NULL},
                          GC_F(out_channels(c))};
        memcpy(in[0].dims, c->x, sizeof c->x);
        memcpy(in[1].dims, c->w, sizeof c->w);
        char label[160];
        snprintf(label, sizeof label, "%s%s", c->label, layout_name());
        gc_check(label, 2 + c->bias, in, build_cv, (void *)c);
    }
}

/* conv_bwd_data and conv_bwd_weight built directly: their own gradients
 * (double backward) are convolutions too. */
typedef struct rawop {
    int op;
    cv c;
    int64_t extra[3];
} rawop;

static ts_val build_raw(ts_graph *g, const ts_val *in, void *u) {
    const rawop *r = u;
    ts_attrs at = ts_attrs_zero();
    at.conv.nd = r->c.nd;
    at.conv.groups = r->c.groups;
    for (int j = 0; j < r->c.nd; j++) {
        at.conv.stride[j] = r->c.s[j];
        at.conv.padding[j] = r->c.p[j];
        at.conv.dilation[j] = r->c.d[j];
    }
    for (int j = 0; j < 3; j++) at.conv.extra[j] = r->extra[j];
    return ts_node_add(g, r->op, 2, in, &at, NULL);
}

static void double_backward(void) {
    /* x [1,2,8,5] (one row more than the smallest input of dy's height),
     * w [3,2,3,2], stride (2,3), padding (1,0) -> dy [1,3,4,2]. */
    rawop bd = {TS_OP_CONV_BWD_DATA, {"", 0, 2, 0, {0}, {0}, {2, 3}, {1, 0}, {1, 1}, {0}, 1}, {1}};
    gc_input in_bd[2] = {GC_F(1, 3, 4, 2), GC_F(3, 2, 3, 2)};
    gc_check("conv_bwd_data (dy, w), extra input row", 2, in_bd, build_raw, &bd);
    rawop bw = {
        TS_OP_CONV_BWD_WEIGHT, {"", 0, 2, 0, {0}, {0}, {2, 3}, {1, 0}, {1, 1}, {0}, 1}, {3, 2}};
    gc_input in_bw[2] = {GC_F(1, 3, 4, 2), GC_F(1, 2, 8, 5)};
    gc_check("conv_bwd_weight (dy, x)", 2, in_bw, build_raw, &bw);
    rawop gw = {TS_OP_CONV_BWD_WEIGHT, {"", 0, 1, 0, {0}, {0}, {1}, {1}, {2}, {0}, 2}, {3}};
    gc_input in_gw[2] = {GC_F(2, 4, 6), GC_F(2, 2, 8)};
    gc_check("conv_bwd_weight groups 2 dilation 2", 2, in_gw, build_raw, &gw);
}

/* ---- forward values from PyTorch ---------------------------------------- */

/* Generated with PyTorch 1.13 (f64; element i of each tensor is
 * sin(0.37*i + k), k = 0 for x, 1 for w, 2 for b):
 *   t = lambda shape, k: torch.tensor([math.sin(0.37*i + k)
 *                        for i in range(math.prod(shape))]).reshape(shape)
 *   F.conv1d(t([2,3,7],0), t([4,3,3],1), t([4],2), stride=2, padding=1)
 *   F.conv2d(t([1,4,5,6],0), t([4,2,3,2],1), t([4],2), stride=(1,2), padding=(1,0),
 *            dilation=(2,1), groups=2)
 *   F.conv3d(t([1,2,3,4,3],0), t([2,2,2,3,2],1), None, stride=(2,1,1), padding=(1,1,0))
 *   F.conv2d(t([1,3,4,4],0), t([3,1,3,3],1), None, padding=1, groups=3)
 *   F.conv_transpose2d(t([1,2,2,3],0), t([2,2,3,3],1), t([2],2), stride=2, padding=1,
 *                      output_padding=1)
 *   F.conv_transpose3d(t([1,2,2,2,2],0), t([2,1,2,2,2],1), t([1],2), stride=2)
 * printed with '%.17g'. */
static const double want_conv1d[32] = {
    2.5151999927496886,   2.8462793478093138,   1.7069830321652502,
    0.61798836078762021,  -0.99528046324341179, -1.5283632186161591,
    -0.3755412119270245,  0.89522402656766453,  2.1101948389924159,
    2.8264138913396706,   1.7008673857506253,   0.29330707190288252,
    -1.6536239295134225,  -2.5276305337528715,  -1.4691953746731663,
    0.025343010265075273, 1.3977833973314515,   0.13673934427564882,
    -1.0157667502901495,  -0.35365701608699296, 0.069206447171023755,
    1.3540451598317362,   2.7255894321055045,   2.1796466613882108,
    1.1363124104852214,   -0.12684737532331469, -1.6688875168967057,
    -1.2584339604195525,  -0.80481406546372769, 0.39196047731219613,
    2.0499199137037944,   1.7894825273431572}; /* [2, 4, 4] */
static const double want_conv2d_g2[36] = {
    2.7331149614268426,   0.47234051030111235, -1.5598779965211216,
    -1.4826625988956386,  0.28607758285365592, 2.3808009326475998,
    3.8528166787517248,   2.3565949557226471,  0.10334561533451536,
    2.4872667407194218,   3.3430104625217929,  2.8148695991391701,
    -0.8374114601796192,  -2.6156151374685588, -2.6609675176299881,
    0.40512924387222204,  2.458657763926035,   3.5908737705051048,
    2.787813276851959,    0.72314349948507184, -1.5153184820211716,
    -2.7660152903054378,  -1.5194787887229388, 0.72629798724057681,
    3.220415440329722,    2.4209553248583435,  0.5596406578559614,
    0.90005297149180552,  2.4914175830729142,  2.7961363277171429,
    -0.44132705742788275, -2.4617753751632105, -3.1780381733195098,
    -1.1687431347957811,  1.1521711729093254,  2.8869497014101673}; /* [1, 4, 3, 3] */
static const double want_conv3d[32] = {
    -0.82821711648903973, -1.2302706025167087,   -0.10053608008026294,
    0.20903817504980435,  0.7052394881045243,    0.8247080260928068,
    -0.97467449855265076, -1.1509397428720072,   -2.0135247242861496,
    -0.58160425980256303, 0.6324994636878698,    1.0551904522049336,
    1.4342473049002273,   1.3393096023022357,    2.1899100480023468,
    2.7310805362043329,   -0.62467642543827284,  -0.34738170567945559,
    -1.0773912551595946,  -1.2334899073715544,   -1.0463142773756902,
    -0.72837333860722708, 0.99602737009999764,   1.6694609896490669,
    2.7638506441202604,   2.0395619096567748,    0.03418614685348717,
    0.027921251317909714, 0.0054138246504192855, -0.0077824318691645522,
    0.013269464343084958, -1.1247042088241486}; /* [1, 2, 2, 4, 2] */
static const double want_depthwise[48] = {
    -1.0295756150348596,  -0.66027600131310293, 0.17885494226493404,
    0.83933067804873951,  1.3030822816600662,   3.1470330658267174,
    4.141768408119554,    2.8392167334129512,   3.1246598302999287,
    3.6113349261911782,   2.3431226792625317,   0.59728569875127002,
    -0.88548462073669409, -2.2483808106963168,  -3.0608708724605869,
    -2.4075822035328667,  1.5377559813972212,   1.8645797285284382,
    1.2601705897445747,   0.13980030143970906,  0.2917584771460997,
    -1.1698651998000469,  -2.7957079703915775,  -2.4678291243877837,
    -3.380181271957226,   -4.801634939403491,   -4.209992906700041,
    -2.0846899234410459,  -0.21495058263011146, 0.67016983362612015,
    1.7998106642332277,   1.8636252890034553,   -1.4984693820275921,
    -2.3944817888044696,  -2.2601278494468198,  -1.0283215666614116,
    -1.8923498827810143,  -1.2769023056213025,  0.5772490874172107,
    1.3319620274960631,   2.7722396150330182,   4.7525378445103996,
    5.0510504218898147,   3.1215735856691085,   1.1307113624647243,
    0.94620506959003681,  -0.18363682956630137, -0.90144217442966479}; /* [1, 3, 4, 4] */
static const double want_convt2d[48] = {
    1.1330880050798986,   1.470937454105343,    1.2786919425968835,
    1.6572463866028189,   1.3743000653122468,   1.0877682164341531,
    1.0173636656173397,   0.95047994362521715,  0.82173358617326264,
    0.57766065800579436,  0.63795486178094452,  0.51231815685418391,
    1.4069722623344432,   1.714655255623158,    1.3722865050687234,
    1.5779851710412978,   1.2749373480427595,   1.2537948019123746,
    0.65858948027052677,  0.58456909297304704,  0.86682210627396072,
    0.95188005262098163,  1.0808035676533334,   0.95236843154307127,
    0.62063100314190867,  0.40685458208870307,  0.48205660306028886,
    0.21690220107417946,  0.3726113739799547,   0.67662662370832116,
    0.65273274563140438,  0.79560922250280652,  0.85633056238745708,
    1.1731242407846589,   1.0384013255483784,   1.1383898587540173,
    0.30710821422614976,  0.048956640476450541, 0.29441266918233799,
    0.093694104651907084, 0.33624302131270523,  0.38190194490086649,
    1.0709261806310193,   1.214857068625147,    0.83976391210762058,
    0.79131494452835427,  0.58931680838679645,  0.72300011953885623}; /* [1, 2, 4, 6] */
static const double want_convt3d[64] = {
    0.77745161151312303, 0.74174456822847223, 1.3503223555430512,
    1.4374147721461781,  0.72871501832896124, 0.74012645026910739,
    1.4530289835706398,  1.395051679549713,   1.8635024444125516,
    2.061606770885219,   2.2475353605297639,  2.5298391056333029,
    2.1037514333669298,  1.9842323495003338,  2.5928101368149128,
    2.4279256204146229,  0.7744343802692587,  0.82699539094967034,
    1.2713298161988011,  1.0986085673169521,  0.89069559608959614,
    0.95691347175451835, 0.90026494366831666, 0.70314382424173638,
    1.7192258665974065,  1.3445993689174474,  2.0575019022189802,
    1.5316740947495464,  0.91105679546909246, 0.477276099728423,
    0.92161052497755402, 0.30988043513405983, 2.4504440502780742,
    2.7787387264594576,  2.4447657743877427,  2.7746182373257673,
    2.854013292680996,   2.6660796895335581,  2.8520082791781034,
    2.6664615208331366,  2.2312690608625303,  2.5180353271063893,
    1.8388496883197143,  2.0437172890146709,  2.5870664654779079,
    2.4290194352382102,  2.0950464831664952,  1.985890105142875,
    2.2403738485667635,  1.6345130582790863,  2.2430908455936658,
    1.6391974882317308,  0.93049773441451433, 0.22361304837293217,
    0.93651558167446503, 0.23014982554455243, 2.0652851604981048,
    1.5450933689890438,  1.7310219586335889,  1.3649372516281426,
    0.93884957936176938, 0.32860604452414977, 0.93718383183872889,
    0.50565611795183862}; /* [1, 1, 4, 4, 4] */

static void fill_sin(double *v, int64_t n, double k) {
    for (int64_t i = 0; i < n; i++) v[i] = sin(0.37 * (double)i + k);
}

static int64_t prod(const int64_t *d, int r) {
    int64_t n = 1;
    for (int i = 0; i < r; i++) n *= d[i];
    return n;
}

/* Forward of configuration c on the sin inputs in dtype dt (f32 runs on
 * oneDNN, f64 on the reference kernels), compared with want. */
static void torch_case(const cv *c, const double *want, int64_t n, ts_dtype dt) {
    ts_graph *g = ts_graph_new();
    ts_val in[3];
    const int64_t *dims[3] = {c->x, c->w, (int64_t[]){out_channels(c)}};
    int ranks[3] = {rank_of(c), rank_of(c), 1};
    for (int i = 0; i < 2 + c->bias; i++) {
        int64_t m = prod(dims[i], ranks[i]);
        double *v = malloc((size_t)m * sizeof(double));
        float *f = malloc((size_t)m * sizeof(float));
        fill_sin(v, m, i);
        for (int64_t e = 0; e < m; e++) f[e] = (float)v[e];
        in[i] = ts_constant(g, NULL, dt, ranks[i], dims[i], dt == TS_F64 ? (void *)v : (void *)f);
        free(v);
        free(f);
    }
    ts_val y = build_cv(g, in, (void *)c);
    CHECK(ts_numel(g, y) == n, "%s: %lld outputs, torch has %lld", c->label,
          (long long)ts_numel(g, y), (long long)n);
    ts_plan *p = NULL;
    CHECK_OK(ts_mark_output(g, y, "out"));
    CHECK_OK(ts_compile(g, NULL, NULL, &p));
    if (p && ts_numel(g, y) == n) {
        double *got = calloc((size_t)n, sizeof(double));
        float *gf = calloc((size_t)n, sizeof(float));
        CHECK_OK(ts_plan_step(p));
        if (dt == TS_F64) {
            CHECK_OK(ts_plan_read(p, "out", got, (size_t)n * sizeof(double)));
        } else {
            CHECK_OK(ts_plan_read(p, "out", gf, (size_t)n * sizeof(float)));
            for (int64_t e = 0; e < n; e++) got[e] = gf[e];
        }
        double tol = dt == TS_F64 ? 1e-12 : 2e-5;
        int bad = 0;
        for (int64_t e = 0; e < n; e++)
            if (!(fabs(got[e] - want[e]) <= tol * (1 + fabs(want[e])))) {
                if (bad++ < 3)
                    fprintf(stderr, "%s %s: element %lld = %.12g, torch %.12g\n", c->label,
                            ts_dtype_name(dt), (long long)e, got[e], want[e]);
            }
        CHECK(bad == 0, "%s (%s): %d values differ from torch", c->label, ts_dtype_name(dt), bad);
        free(got);
        free(gf);
    }
    ts_plan_free(p);
    ts_graph_free(g);
}

static void torch_values(void) {
    /* clang-format off */
    static const struct {
        cv c;
        const double *want;
        int64_t n;
    } cases[] = {
        {{"torch conv1d", 0, 1, 1, {2, 3, 7}, {4, 3, 3}, {2}, {1}, {1}, {0}, 1}, want_conv1d, 32},
        {{"torch conv2d groups 2",
          0, 2, 1, {1, 4, 5, 6}, {4, 2, 3, 2}, {1, 2}, {1, 0}, {2, 1}, {0}, 2},
         want_conv2d_g2, 36},
        {{"torch conv3d",
          0, 3, 0, {1, 2, 3, 4, 3}, {2, 2, 2, 3, 2}, {2, 1, 1}, {1, 1, 0}, {1, 1, 1}, {0}, 1},
         want_conv3d, 32},
        {{"torch depthwise", 0, 2, 0, {1, 3, 4, 4}, {3, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, {0}, 3},
         want_depthwise, 48},
        {{"torch conv_transpose2d",
          1, 2, 1, {1, 2, 2, 3}, {2, 2, 3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, 1},
         want_convt2d, 48},
        {{"torch conv_transpose3d",
          1, 3, 1, {1, 2, 2, 2, 2}, {2, 1, 2, 2, 2}, {2, 2, 2}, {0, 0, 0}, {1, 1, 1}, {0, 0, 0}, 1},
         want_convt3d, 64},
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        torch_case(&cases[i].c, cases[i].want, cases[i].n, TS_F64);
        torch_case(&cases[i].c, cases[i].want, cases[i].n, TS_F32);
    }
}

/* ---- oneDNN against the reference kernels, 1 vs 2 threads ---------------- */

static uint64_t lcg = 12345;
static float frand(void) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(lcg >> 40) / 16777216.0 * 2 - 1);
}

enum { P_REF, P_DNNL1, P_DNNL2, NPLANS };

/* y, grad:x, grad:w[, grad:b] of sum(y * R) for plan kind k. Returns the
 * number of conv instructions that run on oneDNN. */
static int run_plan(const cv *c, int k, float **res, int64_t *cnt) {
    ts_graph *g = ts_graph_new();
    lcg = 777;
    const int64_t *dims[3] = {c->x, c->w, (int64_t[]){out_channels(c)}};
    int ranks[3] = {rank_of(c), rank_of(c), 1};
    const char *names[3] = {"x", "w", "b"};
    ts_val in[3];
    for (int i = 0; i < 2 + c->bias; i++) {
        int64_t m = prod(dims[i], ranks[i]);
        float *v = malloc((size_t)m * sizeof(float));
        for (int64_t e = 0; e < m; e++) v[e] = frand();
        in[i] = ts_param(g, names[i], TS_F32, ranks[i], dims[i], ts_init_buffer(v));
        free(v);
    }
    ts_val y = build_cv(g, in, (void *)c);
    int64_t yn = ts_numel(g, y), yd[5];
    for (int i = 0; i < rank_of(c); i++) yd[i] = ts_dim(g, y, i);
    float *r = malloc((size_t)yn * sizeof(float));
    for (int64_t e = 0; e < yn; e++) r[e] = frand();
    ts_val loss =
        ts_sum(g, ts_mul(g, y, ts_constant(g, "R", TS_F32, rank_of(c), yd, r)), 0, NULL, 0);
    free(r);
    CHECK_OK(ts_mark_output(g, y, "y"));
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt.kind = TS_OPT_NONE;
    ts_compile_options o = ts_compile_options_default();
    o.reference_kernels = k == P_REF;
    o.threads = k == P_DNNL1 ? 1 : 2;
    ts_plan *p = NULL;
    int on_dnnl = 0;
    CHECK_OK(ts_compile(g, &spec, &o, &p));
    const char *reads[4] = {"y", "grad:x", "grad:w", "grad:b"};
    if (p) {
        CHECK_OK(ts_plan_step(p));
        for (int i = 0; i < 3 + c->bias; i++) {
            cnt[i] = i == 0 ? yn : prod(dims[i - 1], ranks[i - 1]);
            res[i] = malloc((size_t)cnt[i] * sizeof(float));
            CHECK_OK(ts_plan_read(p, reads[i], res[i], (size_t)cnt[i] * sizeof(float)));
        }
        for (int i = 0; i < p->prog.n_ins; i++)
            if (p->prog.ins[i].op >= TS_OP_CONV && p->prog.ins[i].op <= TS_OP_CONV_TRANSPOSE)
                on_dnnl += p->rt.ins[i].k.backend != NULL;
        ts_plan_free(p);
    }
    ts_graph_free(g);
    return on_dnnl;
}

/* clang-format off */
static const cv big[] = {
    {"conv2d 16->32 14x14 pad 1", 0, 2, 1, {3, 16, 14, 14}, {32, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1},
     {0}, 1},
    {"conv2d groups 2 stride 2", 0, 2, 1, {2, 8, 9, 11}, {8, 4, 3, 3}, {2, 2}, {1, 1}, {1, 1}, {0},
     2},
    {"conv2d depthwise 32", 0, 2, 1, {2, 32, 12, 12}, {32, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, {0},
     32},
    {"conv2d stride 3, unread tail", 0, 2, 0, {2, 5, 10, 11}, {7, 5, 4, 3}, {3, 3}, {0, 0}, {1, 1},
     {0}, 1},
    {"conv1d dilation 2 stride 2", 0, 1, 1, {3, 6, 50}, {10, 6, 5}, {2}, {2}, {2}, {0}, 1},
    {"conv3d 16->16 8^3 pad 1 (W4-like)", 0, 3, 1, {3, 16, 8, 8, 8}, {16, 16, 3, 3, 3}, {1, 1, 1},
     {1, 1, 1}, {1, 1, 1}, {0}, 1},
    {"conv3d 16->20 7x6x5 pad 1, no bias (Winograd when channels last)", 0, 3, 0,
     {2, 16, 7, 6, 5}, {20, 16, 3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {0}, 1},
    {"conv3d 1->16 N=1", 0, 3, 1, {1, 1, 6, 6, 6}, {16, 1, 3, 3, 3}, {1, 1, 1}, {1, 1, 1},
     {1, 1, 1}, {0}, 1},
    {"conv3d stride, dilation", 0, 3, 0, {2, 4, 6, 7, 5}, {8, 4, 3, 2, 3}, {2, 1, 2}, {1, 0, 1},
     {1, 2, 1}, {0}, 1},
    {"conv_transpose3d 32->16 2^3 stride 2 (W4)", 1, 3, 1, {2, 32, 4, 4, 4}, {32, 16, 2, 2, 2},
     {2, 2, 2}, {0, 0, 0}, {1, 1, 1}, {0, 0, 0}, 1},
    {"conv_transpose2d groups 2 output_padding 1", 1, 2, 1, {2, 8, 5, 6}, {8, 3, 3, 3}, {2, 2},
     {1, 1}, {1, 1}, {1, 1}, 2},
};
/* clang-format on */

static void dnnl_vs_reference(void) {
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        const cv *c = &big[i];
        float *res[NPLANS][4] = {{0}};
        int64_t cnt[4] = {0};
        int on[NPLANS];
        for (int k = 0; k < NPLANS; k++) on[k] = run_plan(c, k, res[k], cnt);
        CHECK(on[P_REF] == 0, "%s%s: reference plan uses oneDNN", c->label, layout_name());
        /* conv: y, dx, dw; conv_transpose: y, dx (a conv), dw. */
        CHECK(on[P_DNNL1] == 3 && on[P_DNNL2] == 3,
              "%s%s: %d and %d of 3 conv instructions run on oneDNN (1 and 2 threads)", c->label,
              layout_name(), on[P_DNNL1], on[P_DNNL2]);
        const char *what[4] = {"y", "dx", "dw", "db"};
        for (int t = 0; t < 3 + c->bias; t++) {
            if (!res[P_REF][t] || !res[P_DNNL1][t] || !res[P_DNNL2][t]) continue;
            double mx = 0, worst = 0;
            for (int64_t e = 0; e < cnt[t]; e++) {
                mx = fmax(mx, fabs(res[P_REF][t][e]));
                worst = fmax(worst, fabs((double)res[P_DNNL2][t][e] - res[P_REF][t][e]));
            }
            CHECK(worst <= 2e-5 * mx,
                  "%s%s: oneDNN %s differs from the reference by %.3g (max %.3g)", c->label,
                  layout_name(), what[t], worst, mx);
            CHECK(!memcmp(res[P_DNNL1][t], res[P_DNNL2][t], (size_t)cnt[t] * sizeof(float)),
                  "%s%s: oneDNN %s differs between 1 and 2 threads", c->label, layout_name(),
                  what[t]);
        }
        for (int k = 0; k < NPLANS; k++)
            for (int t = 0; t < 4; t++) free(res[k][t]);
    }
}

/* The channels-last reference kernels against the channels-first ones on
 * the larger shapes (both through permutes to the same layout). */
static void layouts_agree(void) {
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        const cv *c = &big[i];
        float *res[2][4] = {{0}};
        int64_t cnt[4] = {0};
        for (int l = 0; l < 2; l++) {
            layout = l ? TS_CHANNELS_LAST : TS_CHANNELS_FIRST;
            run_plan(c, P_REF, res[l], cnt);
        }
        layout = TS_CHANNELS_FIRST;
        const char *what[4] = {"y", "dx", "dw", "db"};
        for (int t = 0; t < 3 + c->bias; t++) {
            if (!res[0][t] || !res[1][t]) continue;
            double mx = 0, worst = 0;
            for (int64_t e = 0; e < cnt[t]; e++) {
                mx = fmax(mx, fabs(res[0][t][e]));
                worst = fmax(worst, fabs((double)res[1][t][e] - res[0][t][e]));
            }
            CHECK(worst <= 2e-5 * mx,
                  "%s: channels-last reference %s differs from channels first by %.3g (max %.3g)",
                  c->label, what[t], worst, mx);
        }
        for (int l = 0; l < 2; l++)
            for (int t = 0; t < 4; t++) free(res[l][t]);
    }
}

/* ---- errors ------------------------------------------------------------- */

static void errors(void) {
    /* clang-format off */
    static const struct {
        const char *what, *needle;
        int transpose, nd, xr, wr;
        int64_t x[5], w[5], groups, pad, stride, outpad;
    } cases[] = {
        {"channels not divisible by groups", "channels (3) are not divisible by groups (2)", 0, 2,
         4, 4, {1, 3, 5, 5}, {4, 1, 3, 3}, 2, 0, 1, 0},
        {"output channels not divisible by groups", "output channels (3) are not divisible", 0, 2,
         4, 4, {1, 4, 5, 5}, {3, 2, 3, 3}, 2, 0, 1, 0},
        {"kernel larger than the padded input", "larger than the padded input", 0, 2, 4, 4,
         {1, 2, 3, 3}, {2, 2, 5, 5}, 1, 0, 1, 0},
        {"wrong weight rank", "weight must be [O, C/groups, k...] of rank 4", 0, 2, 4, 3,
         {1, 2, 5, 5}, {2, 2, 3}, 1, 0, 1, 0},
        {"weight channels differ from x", "input channels per group", 0, 2, 4, 4, {1, 4, 5, 5},
         {2, 3, 3, 3}, 1, 0, 1, 0},
        {"x of the wrong rank", "x must have rank 4", 0, 2, 3, 4, {2, 5, 5}, {2, 2, 3, 3}, 1, 0, 1,
         0},
        {"spatial rank 4", "spatial rank must be 1, 2 or 3", 0, 4, 4, 4, {1, 2, 5, 5}, {2, 2, 3, 3},
         1, 0, 1, 0},
        {"negative padding", "padding -1", 0, 2, 4, 4, {1, 2, 5, 5}, {2, 2, 3, 3}, 1, -1, 1, 0},
        {"stride 0", "stride 0", 0, 1, 3, 3, {1, 2, 5}, {2, 2, 3}, 1, 0, 0, 0},
        {"transpose: output_padding >= stride",
         "output_padding 1 must be smaller than the stride 1", 1, 2, 4, 4, {1, 2, 3, 3},
         {2, 2, 3, 3}, 1, 0, 1, 1},
        {"transpose: weight rows differ from x channels", "weight has 3 input channels", 1, 2, 4, 4,
         {1, 2, 3, 3}, {3, 2, 3, 3}, 1, 0, 1, 0},
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", TS_F32, cases[i].xr, cases[i].x);
        ts_val w = ts_input(g, "w", TS_F32, cases[i].wr, cases[i].w);
        int64_t s[3] = {cases[i].stride, cases[i].stride, cases[i].stride};
        int64_t p[3] = {cases[i].pad, cases[i].pad, cases[i].pad};
        int64_t op[3] = {cases[i].outpad, cases[i].outpad, cases[i].outpad};
        ts_val y = cases[i].transpose
                       ? ts_conv_transpose(g, x, w, TS_NONE, cases[i].nd, s, p, op, cases[i].groups)
                       : ts_conv(g, x, w, TS_NONE, cases[i].nd, s, p, NULL, cases[i].groups);
        const char *e = ts_graph_error(g);
        CHECK(!ts_val_ok(y), "%s must fail", cases[i].what);
        CHECK(strstr(e, "conv") && strstr(e, cases[i].needle), "%s: message '%s'", cases[i].what,
              e);
        ts_graph_free(g);
    }
    /* A bias of the wrong length names the bias and the operand shapes. */
    ts_graph *g = ts_graph_new();
    ts_val x = ts_input(g, "x", TS_F32, 3, (int64_t[]){1, 2, 5});
    ts_val w = ts_input(g, "w", TS_F32, 3, (int64_t[]){4, 2, 3});
    ts_val b = ts_input(g, "b", TS_F32, 1, (int64_t[]){3});
    CHECK(!ts_val_ok(ts_conv(g, x, w, b, 1, NULL, NULL, NULL, 1)),
          "a [3] bias for 4 channels must fail");
    const char *e = ts_graph_error(g);
    CHECK(strstr(e, "bias must be f32[4]") && strstr(e, "f32[1,2,5]"), "message: %s", e);
    ts_graph_free(g);
}

int main(void) {
    gradchecks();
    double_backward();
    torch_values();
    dnnl_vs_reference();
    layout = TS_CHANNELS_LAST;
    gradchecks();
    dnnl_vs_reference();
    layout = TS_CHANNELS_FIRST;
    layouts_agree();
    errors();
    return check_summary("gradcheck_conv");
}
