/* Optimizer ops (sgd_update, adam_update, clip_coef) against torch 1.13.
 *
 * The kernels are run directly on two small tensors for three steps, the
 * way the plan runs them: clip_coef over both gradients, then one update
 * node per parameter, with the learning rate of each step in the step
 * context. The reference values come from this script (torch 1.13.0, CPU,
 * `LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp python3`):
 *
 *   import torch
 *   P0 = [[0.5, -1.25, 2.0, 0.75, -0.375, 1.5], [0.25, -0.5, 1.0]]
 *   G = [[[0.25, -0.5, 0.125, 1.0, -0.75, 0.0625], [2.0, -1.5, 0.5]],
 *        [[-0.125, 0.375, 0.5, -0.25, 1.25, -1.0], [-1.0, 0.25, 0.75]],
 *        [[0.5, 0.5, -0.625, 0.875, -0.0625, 0.25], [0.5, 1.0, -2.0]]]
 *   LR = [0.1, 0.05, 0.025]
 *   CASES = [
 *     ("sgd_plain", lambda ps: torch.optim.SGD(ps, lr=0.1), 0),
 *     ("sgd_momentum_wd", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1,
 *                                                    weight_decay=0.01), 0),
 *     ("sgd_nesterov", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True), 0),
 *     ("sgd_wd", lambda ps: torch.optim.SGD(ps, lr=0.1, weight_decay=0.05), 0),
 *     ("adam_wd", lambda ps: torch.optim.Adam(ps, lr=0.1, betas=(0.9, 0.999), eps=1e-8,
 *                                             weight_decay=0.1, foreach=False), 0),
 *     ("adamw", lambda ps: torch.optim.AdamW(ps, lr=0.1, betas=(0.8, 0.99), eps=1e-6,
 *                                            weight_decay=0.1, foreach=False), 0),
 *     ("sgd_momentum_clip", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), 1.0),
 *     ("adam_clip", lambda ps: torch.optim.Adam(ps, lr=0.1, foreach=False), 1.5)]
 *   for dt in (torch.float32, torch.float64):
 *     for name, mk, clip in CASES:
 *       ps = [torch.tensor(p, dtype=dt, requires_grad=True) for p in P0]
 *       opt = mk(ps)
 *       for t in range(3):
 *         for gr in opt.param_groups: gr['lr'] = LR[t]
 *         for p, g in zip(ps, G[t]): p.grad = torch.tensor(g, dtype=dt)
 *         if clip:
 *           tot = torch.nn.utils.clip_grad_norm_(ps, clip)
 *           print(float(torch.clamp(clip / (tot + 1e-6), max=1.0)))   # the coefficient
 *         opt.step()
 *         print([float(x) for p in ps for x in p.detach()])   # "%.9g" f32, "%.17g" f64
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "ops/op.h"

#define NA 6 /* elements of the first tensor */
#define NB 3 /* elements of the second */
#define NP (NA + NB)

static const double P0[NP] = {0.5, -1.25, 2.0, 0.75, -0.375, 1.5, 0.25, -0.5, 1.0};
static const double G[3][NP] = {{0.25, -0.5, 0.125, 1.0, -0.75, 0.0625, 2.0, -1.5, 0.5},
                                {-0.125, 0.375, 0.5, -0.25, 1.25, -1.0, -1.0, 0.25, 0.75},
                                {0.5, 0.5, -0.625, 0.875, -0.0625, 0.25, 0.5, 1.0, -2.0}};
static const double LR[3] = {0.1, 0.05, 0.025};

typedef struct ocase {
    const char *name;
    int op;   /* TS_OP_SGD_UPDATE or TS_OP_ADAM_UPDATE */
    int kind; /* SGD: 0 plain, 1 momentum; Adam: 0 Adam, 1 AdamW */
    int nesterov;
    double f[4]; /* the op's float attributes: SGD momentum, dampening, weight_decay; Adam
                    beta1, beta2, eps, weight_decay */
    double clip; /* max_norm, 0: none */
    double coef32[3], coef64[3];
    double ref32[3][NP], ref64[3][NP];
} ocase;

static const ocase CASES[] = {
    {"sgd_plain",
     TS_OP_SGD_UPDATE,
     0,
     0,
     {0, 0, 0, 0},
     0,
     {0},
     {0},
     {{0.474999994, -1.20000005, 1.98749995, 0.649999976, -0.300000012, 1.49374998, 0.049999997,
       -0.349999994, 0.949999988},
      {0.481249988, -1.21875, 1.96249998, 0.662499964, -0.362500012, 1.54374993, 0.099999994,
       -0.362499982, 0.912499964},
      {0.46875, -1.23125005, 1.97812498, 0.64062494, -0.360937506, 1.5374999, 0.0874999911,
       -0.387499988, 0.962499976}},
     {{0.47499999999999998, -1.2, 1.9875, 0.65000000000000002, -0.29999999999999999,
       1.4937499999999999, 0.049999999999999989, -0.34999999999999998, 0.94999999999999996},
      {0.48124999999999996, -1.21875, 1.9625000000000001, 0.66249999999999998, -0.36249999999999999,
       1.54375, 0.099999999999999992, -0.36249999999999999, 0.91249999999999998},
      {0.46874999999999994, -1.23125, 1.9781250000000001, 0.640625, -0.36093749999999997,
       1.5374999999999999, 0.087499999999999994, -0.38750000000000001, 0.96250000000000002}}},
    {"sgd_momentum_wd",
     TS_OP_SGD_UPDATE,
     1,
     0,
     {0.9, 0.1, 0.01, 0},
     0,
     {0},
     {0},
     {{0.4745, -1.19875002, 1.98549998, 0.649249971, -0.299625009, 1.49224997, 0.0497499928,
       -0.3495, 0.949000001},
      {0.46843648, -1.19202304, 1.95558155, 0.61487031, -0.321821421, 1.53309095, 0.00461510196,
       -0.29286772, 0.891872942},
      {0.454352498, -1.19997776, 1.95574069, 0.579573631, -0.330331147, 1.54549944, -0.0269466359,
       -0.289817303, 0.910965085}},
     {{0.47449999999999998, -1.19875, 1.9855, 0.64924999999999999, -0.29962499999999997,
       1.4922500000000001, 0.049749999999999996, -0.34949999999999998, 0.94899999999999995},
      {0.46843647499999996, -1.1920230624999999, 1.9555815249999999, 0.61487033749999997,
       -0.32182141874999998, 1.5330909875000001, 0.0046151124999999947, -0.29286772499999997,
       0.89187295},
      {0.45435249054312499, -1.1999777354359373, 1.9557407054068749, 0.57957364354906249,
       -0.33033114736828123, 1.5454994864028126, -0.026946625275312504, -0.28981730601187494,
       0.91096510608625003}}},
    {"sgd_nesterov",
     TS_OP_SGD_UPDATE,
     1,
     1,
     {0.9, 0, 0, 0},
     0,
     {0},
     {0},
     {{0.452499986, -1.15499997, 1.97625005, 0.560000002, -0.232500002, 1.48812497, -0.129999995,
       -0.215000004, 0.904999971},
      {0.454249978, -1.17037499, 1.92368758, 0.543250024, -0.320875019, 1.58059371, -0.115999989,
       -0.178000003, 0.813499987},
      {0.428474963, -1.19260621, 1.94097197, 0.488525033, -0.329550028, 1.58782959, -0.155949995,
       -0.203225002, 0.884199977}},
     {{0.45250000000000001, -1.155, 1.9762500000000001, 0.56000000000000005, -0.23249999999999998,
       1.4881249999999999, -0.13, -0.21499999999999997, 0.90500000000000003},
      {0.45424999999999999, -1.1703749999999999, 1.9236875, 0.54325000000000001,
       -0.32087499999999997, 1.58059375, -0.11600000000000001, -0.17799999999999996, 0.8135},
      {0.42847499999999999, -1.1926062499999999, 1.940971875, 0.48852499999999999,
       -0.32954999999999995, 1.5878296875, -0.15595000000000001, -0.20322499999999996,
       0.88419999999999999}}},
    {"sgd_wd",
     TS_OP_SGD_UPDATE,
     0,
     0,
     {0, 0, 0.05, 0},
     0,
     {0},
     {0},
     {{0.472499996, -1.19375002, 1.97749996, 0.64625001, -0.298124999, 1.48625004, 0.0487499908,
       -0.347499996, 0.944999993},
      {0.477568746, -1.20951569, 1.94755626, 0.657134414, -0.359879673, 1.53253436, 0.0986281186,
       -0.359131247, 0.905137479},
      {0.464471787, -1.22050381, 1.96074677, 0.634437978, -0.35786733, 1.52436864, 0.0860048309,
       -0.38368234, 0.954006076}},
     {{0.47249999999999998, -1.1937500000000001, 1.9775, 0.64624999999999999, -0.29812499999999997,
       1.4862500000000001, 0.048749999999999974, -0.34749999999999998, 0.94499999999999995},
      {0.47756874999999999, -1.2095156250000001, 1.9475562500000001, 0.65713437499999994,
       -0.35987968749999999, 1.532534375, 0.098628124999999983, -0.35913124999999996,
       0.90513749999999993},
      {0.46447178906249997, -1.22050373046875, 1.9607468046875001, 0.63443795703124994,
       -0.35786733789062497, 1.5243687070312499, 0.086004839843749986, -0.38368233593749995,
       0.95400607812499993}}},
    {"adam_wd",
     TS_OP_ADAM_UPDATE,
     0,
     0,
     {0.9, 0.999, 1e-8, 0.1},
     0,
     {0},
     {0},
     {{0.400000006, -1.14999998, 1.89999998, 0.649999976, -0.275000006, 1.39999998, 0.150000006,
       -0.400000006, 0.900000036},
      {0.377914548, -1.13336611, 1.85206687, 0.623296261, -0.288146734, 1.42808867, 0.136156604,
       -0.371798456, 0.850251734},
      {0.359816641, -1.13571167, 1.84400117, 0.60505724, -0.29221645, 1.43153572, 0.127385855,
       -0.37089631, 0.85519284}},
     {{0.40000000333333319, -1.1500000016, 1.9000000030769231, 0.65000000093023258,
       -0.27500000126984125, 1.4000000047058823, 0.15000000049382714, -0.40000000064516128,
       0.9000000016666666},
      {0.37791453374521095, -1.1333661059741045, 1.8520668587640787, 0.62329626422432693,
       -0.28814673267318414, 1.428088708106134, 0.13615659621305198, -0.37179844930417755,
       0.85025171274237854},
      {0.35981663731512942, -1.1357116185145129, 1.844001099670558, 0.60505725561192658,
       -0.29221644241550088, 1.4315357319447075, 0.12738584958552546, -0.37089631243417004,
       0.85519280066164771}}},
    {"adamw",
     TS_OP_ADAM_UPDATE,
     1,
     0,
     {0.8, 0.99, 1e-6, 0.1},
     0,
     {0},
     {0},
     {{0.395000398, -1.13750017, 1.88000083, 0.642500103, -0.271250129, 1.38500166, 0.147500038,
       -0.395000041, 0.890000224},
      {0.382468611, -1.1302402, 1.82496905, 0.618280053, -0.287389666, 1.41523099, 0.136205688,
       -0.368425369, 0.835480094},
      {0.36421302, -1.13805723, 1.82357407, 0.599463642, -0.292243063, 1.42045486, 0.128247544,
       -0.369848877, 0.842094064}},
     {{0.39500039999839998, -1.1375001999995999, 1.8800007999935999, 0.64250009999989988,
       -0.27125013333315551, 1.3850015999744003, 0.14750004999997501, -0.39500006666662224,
       0.89000019999960001},
      {0.38246859909176112, -1.1302402475183373, 1.8249690174331501, 0.61828006538386848,
       -0.28738965302392416, 1.4152308764269477, 0.1362057040357994, -0.36842538412421183,
       0.83548007261417645},
      {0.36421301915478171, -1.1380572512631726, 1.8235739754581681, 0.59946367286852242,
       -0.29224304799853373, 1.4204548479668275, 0.12824756141274332, -0.36984890215408067,
       0.84209404364913476}}},
    {"sgd_momentum_clip",
     TS_OP_SGD_UPDATE,
     1,
     0,
     {0.9, 0, 0, 0},
     1.0,
     {0.345145047, 0.463427305, 0.378704727},
     {0.34514503077526337, 0.46342734232579263, 0.37870471124760802},
     {{0.491371363, -1.23274279, 1.9956857, 0.715485513, -0.34911412, 1.49784279, 0.180970997,
       -0.44822824, 0.982742727},
      {0.490384907, -1.2336663, 1.98215854, 0.70574683, -0.366429687, 1.52004349, 0.173079312,
       -0.430723786, 0.957598448},
      {0.4852072, -1.23881567, 1.98198855, 0.693080246, -0.373629957, 1.52766693, 0.164794236,
       -0.432314396, 0.965218782}},
     {{0.49137137423061844, -1.2327427484612368, 1.9956856871153092, 0.71548549692247365,
       -0.34911412269185527, 1.4978428435576545, 0.18097099384494733, -0.44822824538371048,
       0.98274274846123688},
      {0.49038491352393293, -1.2336662479374019, 1.9821585627590537, 0.70574681231665926,
       -0.36642968679855215, 1.5200434902748887, 0.17307930819146325, -0.43072379758545259,
       0.95759845993157622},
      {0.48520719731532935, -1.2388156315922714, 1.9819886179119826, 0.69308023868550128,
       -0.37362996453524139, 1.5276668768523465, 0.16479424075680033, -0.43231441385742675,
       0.96521876565560938}}},
    {"adam_clip",
     TS_OP_ADAM_UPDATE,
     0,
     0,
     {0.9, 0.999, 1e-8, 0},
     1.5,
     {0.5177176, 0.695140958, 0.56805706},
     {0.51771754616289511, 0.69514101348868895, 0.568057066871412},
     {{0.400000006, -1.14999998, 1.89999998, 0.649999976, -0.275000006, 1.4000001, 0.150000006,
       -0.400000006, 0.899999976},
      {0.392934382, -1.15280664, 1.85729158, 0.630085826, -0.295309573, 1.4356097, 0.142934382,
       -0.37543571, 0.851778328},
      {0.377618343, -1.16343749, 1.8569665, 0.613640785, -0.302558094, 1.44589984, 0.136722594,
       -0.376995593, 0.857499123}},
     {{0.40000000772622007, -1.1500000038631102, 1.900000015452439, 0.65000000193155516,
       -0.2750000025754068, 1.400000030904873, 0.15000000096577759, -0.40000000128770341,
       0.90000000386311019},
      {0.3929343938534734, -1.1528066307110427, 1.8572915941518948, 0.63008584581109039,
       -0.29530956419225168, 1.43560964307262, 0.14293438653212448, -0.37543571349631333,
       0.85177835870040797},
      {0.37761834915888842, -1.1634374422387399, 1.8569664989139183, 0.61364077545284013,
       -0.30255808587879207, 1.4458997358505967, 0.13672260528663305, -0.37699559509805497,
       0.85749913147887402}}},
};

/* ---- running kernels by hand ------------------------------------------- */

/* An update's attributes by name: kind (SGD has_buf, Adam decoupled),
 * nesterov (SGD), has_coef, and the float attributes in ocase.f's order. */
static void opt_attrs(ts_attrs *a, int op, int kind, int nesterov, int has_coef, const double *f) {
    if (op == TS_OP_SGD_UPDATE) {
        a->sgd.has_buf = kind;
        a->sgd.nesterov = nesterov;
        a->sgd.has_coef = has_coef;
        a->sgd.momentum = f[0];
        a->sgd.dampening = f[1];
        a->sgd.weight_decay = f[2];
    } else {
        a->adam.decoupled = kind;
        a->adam.has_coef = has_coef;
        a->adam.beta1 = f[0];
        a->adam.beta2 = f[1];
        a->adam.eps = f[2];
        a->adam.weight_decay = f[3];
    }
}

static ts_tensor tensor(ts_dtype dt, int64_t n, void *data) {
    ts_tensor t = {dt, n < 0 ? 0 : 1, {n < 0 ? 1 : n}, data};
    return t;
}

/* Run node `id` of g on the given tensors, with scratch as the op asks. */
static ts_status run_node(const ts_graph *g, int id, const ts_tensor *in, const ts_tensor *out,
                          const ts_step_ctx *ctx) {
    const ts_node *n = &g->nodes[id];
    const ts_op_def *d = ts_op_get(n->op);
    size_t sb = d->scratch ? d->scratch(g, n) : 0;
    void *scratch = sb ? ts_aligned_alloc(sb, "test scratch") : NULL;
    ts_kargs k = {&n->a, n->n_in, n->n_out, in, out, scratch, sb, ctx, d->name, NULL};
    ts_status s = d->kernel(&k);
    ts_aligned_free(scratch);
    return s;
}

static double get(ts_dtype dt, const void *p, int64_t i) {
    return dt == TS_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}
static void set(ts_dtype dt, void *p, int64_t i, double v) {
    if (dt == TS_F32)
        ((float *)p)[i] = (float)v;
    else
        ((double *)p)[i] = v;
}

/* One case in one dtype: three steps of clip (optional) + both updates. */
static void run_case(const ocase *c, ts_dtype dt) {
    const int64_t len[2] = {NA, NB};
    const char *dn = ts_dtype_name(dt);
    ts_graph *g = ts_graph_new();
    /* Arrays of doubles are large enough for either dtype. */
    double p[2][NA], gr[2][NA], s1[2][NA], s2[2][NA], coef[1] = {0};
    memset(s1, 0, sizeof s1);
    memset(s2, 0, sizeof s2);
    for (int i = 0; i < NP; i++) set(dt, p[i >= NA], i >= NA ? i - NA : i, P0[i]);

    /* The graph: types for inference and scratch sizes. */
    ts_val vp[2], vg[2], vs1[2], vs2[2], vc = TS_NONE;
    char name[32];
    for (int t = 0; t < 2; t++) {
        int64_t d[1] = {len[t]};
        snprintf(name, sizeof name, "p%d", t);
        vp[t] = ts_input(g, name, dt, 1, d);
        snprintf(name, sizeof name, "g%d", t);
        vg[t] = ts_input(g, name, dt, 1, d);
        snprintf(name, sizeof name, "s1_%d", t);
        vs1[t] = ts_input(g, name, dt, 1, d);
        snprintf(name, sizeof name, "s2_%d", t);
        vs2[t] = ts_input(g, name, dt, 1, d);
    }
    int clip_node = -1, upd_node[2];
    if (c->clip > 0) {
        ts_attrs a = ts_attrs_zero();
        a.clip.max_norm = c->clip;
        vc = ts_node_add(g, TS_OP_CLIP_COEF, 2, vg, &a, NULL);
        clip_node = g->n_nodes - 1;
        CHECK(ts_rank(g, vc) == 0 && ts_dtype_of(g, vc) == dt, "%s %s: clip_coef type", c->name,
              dn);
    }
    for (int t = 0; t < 2; t++) {
        ts_attrs a = ts_attrs_zero();
        ts_val in[5];
        int k = 0;
        in[k++] = vp[t];
        in[k++] = vg[t];
        if (c->op == TS_OP_SGD_UPDATE) {
            if (c->kind) in[k++] = vs1[t];
        } else {
            in[k++] = vs1[t];
            in[k++] = vs2[t];
        }
        if (c->clip > 0) in[k++] = vc;
        opt_attrs(&a, c->op, c->kind, c->op == TS_OP_SGD_UPDATE ? c->nesterov : 0, c->clip > 0,
                  c->f);
        ts_val r = ts_node_add(g, c->op, k, in, &a, NULL);
        CHECK(r.id == TS_NO_OUTPUT, "%s %s: update has no outputs (%s)", c->name, dn,
              ts_graph_error(g));
        upd_node[t] = g->n_nodes - 1;
    }
    /* One fused node over both parameters, run on copies: the same bits. */
    int fused_node;
    {
        ts_attrs a = ts_attrs_zero();
        ts_val in[9];
        int k = 0;
        for (int t = 0; t < 2; t++) {
            in[k++] = vp[t];
            in[k++] = vg[t];
            if (c->op == TS_OP_ADAM_UPDATE || c->kind) in[k++] = vs1[t];
            if (c->op == TS_OP_ADAM_UPDATE) in[k++] = vs2[t];
        }
        if (c->clip > 0) in[k++] = vc;
        opt_attrs(&a, c->op, c->kind, c->op == TS_OP_SGD_UPDATE ? c->nesterov : 0, c->clip > 0,
                  c->f);
        ts_node_add(g, c->op, k, in, &a, NULL);
        fused_node = g->n_nodes - 1;
    }
    CHECK_OK(ts_graph_status(g));
    if (ts_graph_status(g) != TS_OK) {
        ts_graph_free(g);
        return;
    }
    double fp[2][NA], fs1[2][NA], fs2[2][NA];
    memcpy(fp, p, sizeof p);
    memcpy(fs1, s1, sizeof s1);
    memcpy(fs2, s2, sizeof s2);

    double tol = dt == TS_F32 ? 1e-6 : 1e-13, maxerr = 0;
    for (int step = 1; step <= 3; step++) {
        ts_step_ctx ctx = {step, 0, LR[step - 1], 0};
        for (int i = 0; i < NP; i++) set(dt, gr[i >= NA], i >= NA ? i - NA : i, G[step - 1][i]);
        ts_tensor tc = tensor(dt, -1, coef);
        if (clip_node >= 0) {
            ts_tensor tg[2] = {tensor(dt, NA, gr[0]), tensor(dt, NB, gr[1])};
            CHECK_OK(run_node(g, clip_node, tg, &tc, &ctx));
            double want = dt == TS_F32 ? c->coef32[step - 1] : c->coef64[step - 1];
            CHECK_NEAR(get(dt, coef, 0), want, tol);
        }
        for (int t = 0; t < 2; t++) {
            ts_tensor in[5];
            int k = 0;
            in[k++] = tensor(dt, len[t], p[t]);
            in[k++] = tensor(dt, len[t], gr[t]);
            if (c->op == TS_OP_ADAM_UPDATE || c->kind) in[k++] = tensor(dt, len[t], s1[t]);
            if (c->op == TS_OP_ADAM_UPDATE) in[k++] = tensor(dt, len[t], s2[t]);
            if (clip_node >= 0) in[k++] = tc;
            CHECK_OK(run_node(g, upd_node[t], in, NULL, &ctx));
        }
        {
            ts_tensor in[9];
            int k = 0;
            for (int t = 0; t < 2; t++) {
                in[k++] = tensor(dt, len[t], fp[t]);
                in[k++] = tensor(dt, len[t], gr[t]);
                if (c->op == TS_OP_ADAM_UPDATE || c->kind) in[k++] = tensor(dt, len[t], fs1[t]);
                if (c->op == TS_OP_ADAM_UPDATE) in[k++] = tensor(dt, len[t], fs2[t]);
            }
            if (clip_node >= 0) in[k++] = tc;
            CHECK_OK(run_node(g, fused_node, in, NULL, &ctx));
            size_t es = ts_dtype_size(dt);
            for (int t = 0; t < 2; t++)
                CHECK(memcmp(fp[t], p[t], es * (size_t)len[t]) == 0 &&
                          memcmp(fs1[t], s1[t], es * (size_t)len[t]) == 0 &&
                          memcmp(fs2[t], s2[t], es * (size_t)len[t]) == 0,
                      "%s %s step %d: fused update differs from per-parameter (tensor %d)", c->name,
                      dn, step, t);
        }
        const double *ref = dt == TS_F32 ? c->ref32[step - 1] : c->ref64[step - 1];
        for (int i = 0; i < NP; i++) {
            double v = get(dt, p[i >= NA], i >= NA ? i - NA : i);
            double e = fabs(v - ref[i]) / fmax(1.0, fabs(ref[i]));
            if (e > maxerr) maxerr = e;
            CHECK(e <= tol, "%s %s step %d p[%d] = %.17g, torch %.17g", c->name, dn, step, i, v,
                  ref[i]);
            /* Without clipping the f32 updates reproduce torch's bits (the
             * clip coefficient may differ by an ulp: torch sums squares in
             * float in an order of its own, tessel in double). */
            if (dt == TS_F32 && c->clip == 0)
                CHECK((float)v == (float)ref[i], "%s f32 step %d p[%d] = %.9g, torch %.9g (bits)",
                      c->name, step, i, v, ref[i]);
        }
    }
    printf("  %-18s %s: max relative difference from torch %.3g\n", c->name, dn, maxerr);
    ts_graph_free(g);
}

/* ---- thread-count independence ------------------------------------------ */

/* Adam, SGD and clip_coef on a tensor large enough to be split across
 * threads give the same bits with 1 and 4 threads. */
static void check_threads(void) {
    enum { N = 300007 }; /* not a multiple of any chunk or block size */
    ts_graph *g = ts_graph_new();
    int64_t d[1] = {N};
    ts_val p = ts_input(g, "p", TS_F32, 1, d), gv = ts_input(g, "g", TS_F32, 1, d);
    ts_val m = ts_input(g, "m", TS_F32, 1, d), v = ts_input(g, "v", TS_F32, 1, d);
    ts_attrs a = ts_attrs_zero();
    a.clip.max_norm = 0.5;
    ts_val gs[2] = {gv, m};
    ts_val coef = ts_node_add(g, TS_OP_CLIP_COEF, 2, gs, &a, NULL);
    int clip_node = g->n_nodes - 1;
    a = ts_attrs_zero();
    a.adam.has_coef = 1;
    a.adam.beta1 = 0.9, a.adam.beta2 = 0.999, a.adam.eps = 1e-8, a.adam.weight_decay = 0.01;
    ts_val in[5] = {p, gv, m, v, coef};
    ts_node_add(g, TS_OP_ADAM_UPDATE, 5, in, &a, NULL);
    int adam_node = g->n_nodes - 1;
    CHECK_OK(ts_graph_status(g));

    float *buf[2][4];
    float cf[2];
    int threads = omp_get_max_threads();
    for (int r = 0; r < 2; r++) {
        for (int j = 0; j < 4; j++) buf[r][j] = malloc(sizeof(float) * N);
        for (int i = 0; i < N; i++) {
            buf[r][0][i] = (float)((i % 97) - 48) / 37.0f;
            buf[r][1][i] = (float)((i * 7 % 101) - 50) / 23.0f;
            buf[r][2][i] = (float)((i % 13) - 6) / 11.0f;
            buf[r][3][i] = (float)(i % 5) / 7.0f;
        }
        omp_set_num_threads(r == 0 ? 1 : 4);
        for (int step = 1; step <= 2; step++) {
            ts_step_ctx ctx = {step, 0, 0.01, 0};
            ts_tensor t[5];
            for (int j = 0; j < 4; j++) t[j] = tensor(TS_F32, N, buf[r][j]);
            t[4] = tensor(TS_F32, -1, &cf[r]);
            ts_tensor tg[2] = {t[1], t[2]};
            CHECK_OK(run_node(g, clip_node, tg, &t[4], &ctx));
            CHECK_OK(run_node(g, adam_node, t, NULL, &ctx));
        }
    }
    omp_set_num_threads(threads);
    CHECK(memcmp(&cf[0], &cf[1], sizeof(float)) == 0, "clip_coef differs across thread counts");
    CHECK(cf[0] > 0 && cf[0] < 1, "clip_coef %g should clip", cf[0]);
    for (int j = 0; j < 4; j++)
        CHECK(memcmp(buf[0][j], buf[1][j], sizeof(float) * N) == 0,
              "adam tensor %d differs across thread counts", j);
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 4; j++) free(buf[r][j]);
    ts_graph_free(g);
}

/* A fused update over many parameters of mixed sizes (more groups than
 * the kernel keeps on its stack, so it uses the planned scratch) gives the
 * bits of one node per parameter, with 1 and 4 threads. */
static void check_fused_many(void) {
    enum { K = 12 };
    const int64_t len[K] = {1, 4095, 4096, 4097, 300007, 7, 0 + 64, 12289, 3, 100000, 5, 9000};
    for (int opk = 0; opk < 2; opk++) {
        int op = opk ? TS_OP_ADAM_UPDATE : TS_OP_SGD_UPDATE, gs = opk ? 4 : 3;
        ts_graph *g = ts_graph_new();
        ts_val vin[K * 4 + 1];
        int k = 0;
        for (int t = 0; t < K; t++) {
            int64_t d[1] = {len[t]};
            for (int j = 0; j < gs; j++) {
                char name[32];
                snprintf(name, sizeof name, "t%d_%d", t, j);
                vin[k++] = ts_input(g, name, TS_F32, 1, d);
            }
        }
        vin[k++] = ts_input(g, "coef", TS_F32, 0, NULL);
        ts_attrs a = ts_attrs_zero();
        if (opk)
            opt_attrs(&a, op, 1, 0, 1, (const double[]){0.9, 0.999, 1e-8, 0.01});
        else
            opt_attrs(&a, op, 1, 0, 1, (const double[]){0.9, 0.1, 0.01, 0});
        ts_node_add(g, op, k, vin, &a, NULL);
        int fused = g->n_nodes - 1;
        int single[K];
        for (int t = 0; t < K; t++) {
            ts_val one[5];
            for (int j = 0; j < gs; j++) one[j] = vin[t * gs + j];
            one[gs] = vin[k - 1];
            ts_node_add(g, op, gs + 1, one, &a, NULL);
            single[t] = g->n_nodes - 1;
        }
        CHECK_OK(ts_graph_status(g));
        if (ts_graph_status(g) != TS_OK) {
            ts_graph_free(g);
            continue;
        }
        CHECK(ts_op_get(op)->scratch(g, &g->nodes[fused]) >= sizeof(int64_t) * (K + 1),
              "fused %s: no scratch for %d groups", ts_op_get(op)->name, K);
        /* r = 0: per-parameter nodes; r = 1, 2: fused with 1 and 4 threads. */
        float *buf[3][K][4];
        float cf = 0.75f;
        int threads = omp_get_max_threads();
        for (int r = 0; r < 3; r++) {
            for (int t = 0; t < K; t++)
                for (int j = 0; j < gs; j++) {
                    buf[r][t][j] = malloc(sizeof(float) * (size_t)(len[t] + 1));
                    for (int64_t i = 0; i < len[t]; i++)
                        buf[r][t][j][i] = (float)(((i + 3 * t + j) * 7 % 101) - 50) / 23.0f +
                                          (j == 3 ? 2.5f : 0.0f);
                }
            omp_set_num_threads(r == 1 ? 1 : 4);
            for (int step = 1; step <= 3; step++) {
                ts_step_ctx ctx = {step, 0, 0.01 * step, 0};
                ts_tensor tt[K * 4 + 1];
                int q = 0;
                for (int t = 0; t < K; t++)
                    for (int j = 0; j < gs; j++) tt[q++] = tensor(TS_F32, len[t], buf[r][t][j]);
                tt[q++] = tensor(TS_F32, -1, &cf);
                if (r > 0) {
                    CHECK_OK(run_node(g, fused, tt, NULL, &ctx));
                    continue;
                }
                for (int t = 0; t < K; t++) {
                    ts_tensor one[5];
                    for (int j = 0; j < gs; j++) one[j] = tt[t * gs + j];
                    one[gs] = tt[q - 1];
                    CHECK_OK(run_node(g, single[t], one, NULL, &ctx));
                }
            }
        }
        omp_set_num_threads(threads);
        for (int r = 1; r < 3; r++)
            for (int t = 0; t < K; t++)
                for (int j = 0; j < gs; j++)
                    CHECK(memcmp(buf[0][t][j], buf[r][t][j], sizeof(float) * (size_t)len[t]) == 0,
                          "fused %s (%d threads): tensor %d input %d differs from per-parameter",
                          ts_op_get(op)->name, r == 1 ? 1 : 4, t, j);
        for (int r = 0; r < 3; r++)
            for (int t = 0; t < K; t++)
                for (int j = 0; j < gs; j++) free(buf[r][t][j]);
        ts_graph_free(g);
    }
}

/* The global norm of a large tensor accumulates in double: compare with
 * the exact value of a sum of known squares. */
static void check_clip_large(void) {
    enum { N = 1 << 20 };
    ts_graph *g = ts_graph_new();
    int64_t d[1] = {N};
    ts_val gv = ts_input(g, "g", TS_F32, 1, d);
    ts_attrs a = ts_attrs_zero();
    a.clip.max_norm = 1.0;
    ts_node_add(g, TS_OP_CLIP_COEF, 1, &gv, &a, NULL);
    float *x = malloc(sizeof(float) * N), cf = 0;
    for (int i = 0; i < N; i++) x[i] = (i & 1) ? 0.5f : -0.5f; /* norm = 0.5 * 2^10 = 512 */
    ts_tensor in = tensor(TS_F32, N, x), out = tensor(TS_F32, -1, &cf);
    ts_step_ctx ctx = {1, 0, 0.1, 0};
    CHECK_OK(run_node(g, 0, &in, &out, &ctx));
    CHECK_NEAR(cf, (double)(1.0f / (512.0f + 1e-6f)), 1e-9);
    /* Below max_norm the coefficient is clamped to exactly 1. */
    for (int i = 0; i < N; i++) x[i] = 1e-5f;
    CHECK_OK(run_node(g, 0, &in, &out, &ctx));
    CHECK(cf == 1.0f, "clip_coef below max_norm is %g, not 1", cf);
    free(x);
    ts_graph_free(g);
}

/* A resumed run (step > 1) keeps the momentum buffer instead of replacing
 * it with d_p: buf = 0.9 * buf + g, p -= lr * buf. */
static void check_resume(void) {
    ts_graph *g = ts_graph_new();
    int64_t d[1] = {2};
    ts_val in[3] = {ts_input(g, "p", TS_F64, 1, d), ts_input(g, "g", TS_F64, 1, d),
                    ts_input(g, "b", TS_F64, 1, d)};
    ts_attrs a = ts_attrs_zero();
    a.sgd.has_buf = 1;
    a.sgd.momentum = 0.9;
    ts_node_add(g, TS_OP_SGD_UPDATE, 3, in, &a, NULL);
    double p[2] = {1, 2}, gr[2] = {0.5, -0.5}, b[2] = {1, 1};
    ts_tensor t[3] = {tensor(TS_F64, 2, p), tensor(TS_F64, 2, gr), tensor(TS_F64, 2, b)};
    ts_step_ctx ctx = {7, 0, 0.5, 0};
    CHECK_OK(run_node(g, 0, t, NULL, &ctx));
    CHECK_NEAR(b[0], 1.4, 1e-15);
    CHECK_NEAR(b[1], 0.4, 1e-15);
    CHECK_NEAR(p[0], 1 - 0.5 * 1.4, 1e-15);
    CHECK_NEAR(p[1], 2 - 0.5 * 0.4, 1e-15);
    ts_graph_free(g);
}

/* ---- inference errors --------------------------------------------------- */

static void expect_error(ts_graph *g, const char *what, const char *needle) {
    CHECK(ts_graph_status(g) != TS_OK, "%s: accepted", what);
    CHECK(strstr(ts_graph_error(g), needle) != NULL, "%s: message '%s' lacks '%s'", what,
          ts_graph_error(g), needle);
    ts_graph_free(g);
}

static void check_errors(void) {
    int64_t d3[1] = {3}, d4[1] = {4};
    ts_graph *g = ts_graph_new();
    ts_val in[3] = {ts_input(g, "p", TS_F32, 1, d3), ts_input(g, "g", TS_F32, 1, d4)};
    ts_node_add(g, TS_OP_SGD_UPDATE, 2, in, NULL, NULL);
    expect_error(g, "sgd shape mismatch", "sgd_update");

    g = ts_graph_new();
    in[0] = ts_input(g, "p", TS_F32, 1, d3), in[1] = ts_input(g, "g", TS_F32, 1, d3);
    ts_attrs a = ts_attrs_zero();
    a.sgd.has_buf = 1; /* but no buffer given */
    ts_node_add(g, TS_OP_SGD_UPDATE, 2, in, &a, NULL);
    expect_error(g, "sgd missing buffer", "inputs");

    g = ts_graph_new();
    in[0] = ts_input(g, "p", TS_F32, 1, d3), in[1] = ts_input(g, "g", TS_F32, 1, d3);
    a = ts_attrs_zero();
    a.sgd.nesterov = 1; /* without momentum */
    ts_node_add(g, TS_OP_SGD_UPDATE, 2, in, &a, NULL);
    expect_error(g, "nesterov without buffer", "nesterov");

    g = ts_graph_new();
    ts_val q[5] = {ts_input(g, "p", TS_F32, 1, d3), ts_input(g, "g", TS_F32, 1, d3),
                   ts_input(g, "m", TS_F32, 1, d3), ts_input(g, "v", TS_F32, 1, d3),
                   ts_input(g, "c", TS_F32, 1, d3)};
    a = ts_attrs_zero();
    a.adam.has_coef = 1;
    ts_node_add(g, TS_OP_ADAM_UPDATE, 5, q, &a, NULL);
    expect_error(g, "adam coef not scalar", "coefficient");

    g = ts_graph_new();
    ts_val gi[2] = {ts_input(g, "a", TS_F32, 1, d3), ts_input(g, "b", TS_F64, 1, d3)};
    a = ts_attrs_zero();
    a.clip.max_norm = 1;
    ts_node_add(g, TS_OP_CLIP_COEF, 2, gi, &a, NULL);
    expect_error(g, "clip mixed dtypes", "clip_coef");
}

/* ---- through ts_compile ------------------------------------------------- */

/* A linear model trained for three steps by a compiled plan, against
 * torch 1.13 (same environment as above):
 *
 *   X = torch.tensor([[((i*4+j)*7%13-6)/4 for j in range(4)] for i in range(5)])
 *   Y = torch.tensor([[((i*3+j)*5%11-5)/3 for j in range(3)] for i in range(5)])
 *   W0 = torch.tensor([[((i*4+j)*3%7-3)/5 for j in range(4)] for i in range(3)])
 *   B0 = torch.tensor([0.1, -0.2, 0.3])
 *   CASES = [(lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True,
 *                                        weight_decay=0.01), 0),
 *            (lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1, foreach=False), 0.5),
 *            (lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, foreach=False), 0.5)]
 *   for mk, clip in CASES:
 *     w = W0.clone().requires_grad_(); b = B0.clone().requires_grad_(); o = mk([w, b])
 *     for t in range(3):
 *       o.zero_grad()
 *       torch.nn.functional.mse_loss(torch.nn.functional.linear(X, w, b), Y).backward()
 *       if clip: torch.nn.utils.clip_grad_norm_([w, b], clip)
 *       o.step()
 *       print(torch.cat([w.detach().flatten(), b.detach()]).tolist())   # "%.9g"
 */
static const double PLAN_REF[3][3][15] = {
    /* SGD nesterov, weight decay */
    {{-0.569241107, 0.0471305549, 0.618905008, -0.163393334, 0.333119988, -0.345206112, 0.149407223,
      -0.528918922, 0.019527778, 0.571352243, -0.18767111, 0.364153326, 0.0570494458, -0.135421112,
      0.270159453},
     {-0.526291609, 0.109864794, 0.645878196, -0.114739701, 0.249166101, -0.278901666, 0.0867346525,
      -0.441333175, 0.0428795889, 0.535755515, -0.173813641, 0.319062263, -0.000491687038,
      -0.0511083305, 0.23069258},
     {-0.473344624, 0.182907641, 0.679966211, -0.0581521057, 0.158725187, -0.211179376,
      0.0205003973, -0.349404216, 0.0662187859, 0.497913212, -0.161412865, 0.270281523,
      -0.0678579509, 0.0446881056, 0.185050249}},
    /* Adam, weight decay, clip 0.5 */
    {{-0.590000033, 0.00999999885, 0.590000033, -0.189999998, 0.390000015, -0.390000015,
      0.189999998, -0.590000033, 0.00999999698, 0.590000033, -0.189999998, 0.390000015,
      0.0900000036, -0.189999998, 0.290000021},
     {-0.57999599, 0.019998122, 0.586250842, -0.180003077, 0.380000561, -0.380002528, 0.180001676,
      -0.580001295, 0.0199679099, 0.580009043, -0.180031165, 0.380009472, 0.0799985081,
      -0.179998502, 0.28000474},
     {-0.569986463, 0.0299945474, 0.589463711, -0.170009494, 0.370002061, -0.370009422, 0.17000626,
      -0.570004821, 0.0298742577, 0.570034146, -0.170121893, 0.370035917, 0.0699951053,
      -0.169994399, 0.270017743}},
    /* AdamW, clip 0.5 */
    {{-0.589400053, 0.00999999885, 0.609400034, -0.189799994, 0.389600009, -0.389600009,
      0.189799994, -0.589400053, 0.00999999698, 0.589400053, -0.189800009, 0.389600009,
      0.0899000019, -0.189799994, 0.289700031},
     {-0.578807354, 0.0199933536, 0.618794739, -0.179606423, 0.379209727, -0.379211932, 0.179610312,
      -0.578811109, 0.0199657232, 0.578823745, -0.179652601, 0.379221141, 0.0798082277,
      -0.179607183, 0.279413283},
     {-0.568219543, 0.0299824104, 0.628187001, -0.169416651, 0.368828744, -0.368837088, 0.16943112,
      -0.56823355, 0.0298751947, 0.568282127, -0.169600084, 0.368872344, 0.0697233826, -0.169419438,
      0.269142151}},
};

static void check_plan_training(void) {
    float X[5][4], Y[5][3], W0[3][4], B0[3] = {0.1f, -0.2f, 0.3f};
    for (int i = 0; i < 5; i++) {
        for (int j = 0; j < 4; j++) X[i][j] = (float)(((i * 4 + j) * 7 % 13) - 6) / 4;
        for (int j = 0; j < 3; j++) Y[i][j] = (float)(((i * 3 + j) * 5 % 11) - 5) / 3;
    }
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) W0[i][j] = (float)(((i * 4 + j) * 3 % 7) - 3) / 5;
    const ts_optimizer opts[3] = {ts_sgd(0.05, 0.9, 0, 1, 0.01),
                                  ts_adam(0.01, 0.9, 0.999, 1e-8, 0.1),
                                  ts_adamw(0.01, 0.9, 0.999, 1e-8, 0.1)};
    const double clips[3] = {0, 0.5, 0.5};
    for (int c = 0; c < 3; c++) {
        int64_t xd[2] = {5, 4}, yd[2] = {5, 3}, wd[2] = {3, 4}, bd[1] = {3};
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", TS_F32, 2, xd), y = ts_input(g, "y", TS_F32, 2, yd);
        ts_val w = ts_param(g, "w", TS_F32, 2, wd, ts_init_buffer(W0));
        ts_val b = ts_param(g, "b", TS_F32, 1, bd, ts_init_buffer(B0));
        ts_val loss = ts_mse_loss(g, ts_linear(g, x, w, b), y);
        ts_train_spec spec = ts_train_spec_default(loss);
        spec.opt = opts[c];
        spec.clip_grad_norm = clips[c];
        ts_plan *plan = NULL;
        CHECK_OK(ts_compile(g, &spec, NULL, &plan));
        for (int step = 0; plan && step < 3; step++) {
            float wv[12], bv[3];
            CHECK_OK(ts_plan_set_input(plan, "x", X, sizeof X));
            CHECK_OK(ts_plan_set_input(plan, "y", Y, sizeof Y));
            CHECK_OK(ts_plan_step(plan));
            CHECK_OK(ts_plan_read(plan, "w", wv, sizeof wv));
            CHECK_OK(ts_plan_read(plan, "b", bv, sizeof bv));
            for (int i = 0; i < 15; i++)
                CHECK(fabs((i < 12 ? wv[i] : bv[i - 12]) - PLAN_REF[c][step][i]) <= 1e-5,
                      "plan case %d step %d param %d = %.9g, torch %.9g", c, step + 1, i,
                      i < 12 ? wv[i] : bv[i - 12], PLAN_REF[c][step][i]);
        }
        ts_plan_free(plan);
        ts_graph_free(g);
    }
}

/* The registry maps the op ids to this file's definitions. */
extern const ts_op_def ts_def_sgd_update, ts_def_adam_update, ts_def_clip_coef;

int main(void) {
    CHECK(ts_op_get(TS_OP_SGD_UPDATE) == &ts_def_sgd_update &&
              ts_op_get(TS_OP_ADAM_UPDATE) == &ts_def_adam_update &&
              ts_op_get(TS_OP_CLIP_COEF) == &ts_def_clip_coef,
          "the registry does not hold the optimizer ops");
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        run_case(&CASES[i], TS_F32);
        run_case(&CASES[i], TS_F64);
    }
    check_threads();
    check_fused_many();
    check_clip_large();
    check_resume();
    check_errors();
    check_plan_training();
    return check_summary("optim_ops");
}
