/* Gradient checks, PyTorch parity and train/eval semantics of batch_norm.
 *
 * Reference numbers: PyTorch 1.13 (script below; the inputs are the same
 * closed-form sequences as data() here).
 *
 *   import torch, math
 *   def data(n, k, a):
 *       return torch.tensor([math.sin(a * i + k) * 2.0 + 0.5 * math.cos(1.3 * i)
 *                            for i in range(n)], dtype=torch.float64)
 *   def run(dtype):
 *       bn = torch.nn.BatchNorm2d(3).to(dtype)
 *       with torch.no_grad():
 *           bn.weight.copy_(torch.tensor([1.5, -0.5, 0.75]))
 *           bn.bias.copy_(torch.tensor([0.1, 0.2, -0.3]))
 *       opt = torch.optim.SGD(bn.parameters(), lr=0.1)
 *       R = data(48, 0.3, 0.71).reshape(4, 3, 2, 2).to(dtype)
 *       for step in (1, 2):       # y<step>, rm<step>, rv<step>
 *           x = data(48, step, 0.37).reshape(4, 3, 2, 2).to(dtype)
 *           opt.zero_grad(); y = bn(x); (y * R).sum().backward(); opt.step()
 *           print(y.flatten(), bn.running_mean, bn.running_var)
 *       x3 = data(48, 3, 0.37).reshape(4, 3, 2, 2).to(dtype)
 *       bn.eval(); print(bn(x3).flatten())          # yeval
 *       bn.train(); print(bn(x3).flatten())         # ytrain3 (no step)
 *   run(torch.float64); run(torch.float32)
 *   for shape in ((5, 3), (2, 2, 2, 3, 2)):         # bn1d_*, bn3d_*
 *       x = data(prod(shape), 0.5, 0.23).reshape(shape)
 *       bn = (nn.BatchNorm1d if len(shape) == 2 else nn.BatchNorm3d)(
 *           shape[1], momentum=0.3, eps=1e-3, affine=False).double()
 *       print(bn(x).flatten(), bn.running_mean, bn.running_var)
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "gradcheck.h"

static const double ref64_y1[48] = {
    1.9503603666633849,   1.8637581382826047,   1.3302760747646805,   1.1464405629839014,
    -0.37740778989548307, -0.22813198817586006, 0.21732614745306678,  0.66962527632911029,
    -1.0082151210424541,  -0.90616312926143372, -0.91318446288023969, -1.1127417727149598,
    -2.0936557726807763,  -1.2271263567708364,  0.021382647304815219, 0.73168512532223784,
    -0.20599903731927738, -0.27666723289786294, -0.53381813091818142, -0.73588762475993463,
    0.83549850226929478,  0.30018457992101183,  -0.11462748501488401, -0.22749335665810133,
    -0.54362399747507006, -1.3620046874094429,  -2.3196619590860723,  -2.5176385395501342,
    0.81658603119050943,  0.53650575317602434,  0.45492988523887318,  0.40083780003551689,
    -0.07083456599273176, 0.54339744133270218,  0.91028446771366822,  0.81543919716548596,
    1.2815071207808872,   1.2129952518223905,   1.3189100965233713,   0.80639595236591721,
    0.26797362690071175,  0.68745900918711811,  0.78992420747468828,  0.71674411466469612,
    -0.94066324638758303, -1.159130169117959,   -1.1214035623275622,  -0.63034750773911752};
static const double ref64_rm1[3] = {0.027330740960150958, -0.0083277357667781698,
                                    -0.029120575966708723};
static const double ref64_rv1[3] = {1.1556214691628339, 1.0912404115310608, 1.1513028405436843};
static const double ref64_y2[48] = {
    0.37279702435505074,  0.065918427881651934,  -0.39033958015027975, -0.64395217228099433,
    0.90348437624797018,  1.200113959375668,     1.9141079913881314,   2.4740677243748048,
    -3.2513621207822245,  -2.195145179380503,    -1.4324784558031713,  -1.2664923471676617,
    -0.59927768206623155, -0.20886006112706265,  0.23388531105704191,  0.3679886279844729,
    -0.83031158844043218, -0.4475656844358884,   -0.43850571629461305, -0.37579784677316624,
    -0.25140935840764977, -1.791226183438178,    -2.7489162389027513,  -2.6981213247606055,
    -1.1093344226056623,  -1.1883487158885746,   -1.2986754987780869,  -1.1170680192351325,
    0.78423365373758835,  -0.068276830075539599, -0.31970491412328228, -0.31338762979763612,
    1.1101894463804152,   1.896678150393277,     1.9729728515363898,   0.93863122167985513,
    -0.41780089512531327, -0.622365335856082,    -0.66946147906612008, -0.86470761878264102,
    2.0079125058717793,   2.4945159561072501,    2.2091380305996386,   1.5121821774215849,
    -1.4709311778304113,  -1.3567183659669426,   -0.86558907138625341, 0.41493490715456355};
static const double ref64_rm2[3] = {0.030247679521965089, -0.036338636538958823,
                                    -0.037368792991719309};
static const double ref64_rv2[3] = {1.2411447099292248, 1.2204365862180722, 1.2409431479480306};
static const double ref64_yeval[48] = {
    -0.82584454072664482, -1.2437672984021355,  -1.7127858222469157,  -1.88576016395075,
    5.2878568157982482,   4.7777764187139935,   5.3084740610051391,   5.3806252416778966,
    -2.9119226845429962,  -0.50237907147479455, 1.0268408221371554,   1.1565035483075465,
    -0.61648387599913357, -0.43463691596806409, -0.25262798590137336, -0.38928007135166226,
    -0.51601227174762976, 1.8350120498963149,   2.5760833398808489,   2.8954771084705642,
    -3.6648001323215635,  -5.2879536973393604,  -5.6904986288645514,  -4.3544367128887931,
    -1.4183122601835614,  -1.2700526079358714,  -1.2198459113029658,  -0.97319579753865681,
    -2.3267130131676974,  -4.1338187346483029,  -3.657780790572001,   -2.0976785391478447,
    0.8459875077408977,   0.89399069249551866,  0.086934334050810899, -2.0753233345228224,
    -1.738579936089129,   -1.8601271682844833,  -1.7405245846311337,  -1.7008456648385155,
    5.5297015344930553,   5.3857213251908993,   3.1509201001403153,   0.095278686240800797,
    0.97038100891059742,  1.0018943522190122,   1.1740311222324771,   2.2116278899503947};
static const double ref64_ytrain3[48] = {
    -0.81623637468837773, -1.1412162086163566,  -1.5059284890291285,  -1.6404346191890995,
    4.0139785620003421,   3.6251697858583438,   4.0296940568951332,   4.084691293438496,
    -2.8807102501514281,  -0.97420001288587932, 0.23576911420905899,  0.33836253210566763,
    -0.65343597005707943, -0.51203042612378591, -0.37049893309030402, -0.47676060757425198,
    -0.41002057561863348, 1.3820476834316411,   1.9469292647272742,   2.1903871607425085,
    -3.4764116741934958,  -4.7607042147298477,  -5.0792110177401044,  -4.0220748419873447,
    -1.2769436645897831,  -1.161655860131223,   -1.122614760707527,   -0.93081780412331017,
    -1.7902271925662279,  -3.1676935056110289,  -2.8048335888381697,  -1.6156456676791311,
    0.092672017534880344, 0.13065371774552684,  -0.50791584417488567, -2.2187653006378625,
    -1.5259861831336232,  -1.6205022117723964,  -1.5274983562532303,  -1.4966437341303087,
    4.1983246957267895,   4.0885757830309872,   2.3850985778698779,   0.055935949275798272,
    0.19109625112961956,  0.21603064588475451,  0.35223092566412989,  1.1732116495983689};
static const float ref32_y1[48] = {
    1.9503603f,    1.86375797f,   1.33027613f,    1.14644051f,   -0.377407759f, -0.228131965f,
    0.217326164f,  0.669625282f,  -1.00821507f,   -0.906163096f, -0.913184464f, -1.11274171f,
    -2.09365559f,  -1.22712624f,  0.0213826802f,  0.731685102f,  -0.205999032f, -0.276667237f,
    -0.533818126f, -0.735887587f, 0.835498452f,   0.300184578f,  -0.114627488f, -0.227493361f,
    -0.543623924f, -1.36200464f,  -2.31966186f,   -2.51763844f,  0.816586018f,  0.536505759f,
    0.454929888f,  0.400837809f,  -0.0708345696f, 0.543397427f,  0.910284519f,  0.815439165f,
    1.28150713f,   1.21299517f,   1.31891012f,    0.806395948f,  0.267973632f,  0.687458992f,
    0.789924204f,  0.716744065f,  -0.940663218f,  -1.1591301f,   -1.12140346f,  -0.63034749f};
static const float ref32_rm1[3] = {0.0273307394f, -0.00832773466f, -0.0291205775f};
static const float ref32_rv1[3] = {1.15562141f, 1.09124041f, 1.15130281f};
static const float ref32_y2[48] = {
    0.372797102f,  0.0659184605f, -0.390339583f, -0.643952191f, 0.903484404f,  1.20011401f,
    1.91410804f,   2.47406793f,   -3.25136232f,  -2.19514537f,  -1.43247855f,  -1.26649237f,
    -0.599277675f, -0.20886007f,  0.233885333f,  0.367988646f,  -0.830311656f, -0.447565764f,
    -0.438505739f, -0.375797898f, -0.251409352f, -1.79122627f,  -2.74891639f,  -2.69812131f,
    -1.10933447f,  -1.18834877f,  -1.29867554f,  -1.11706805f,  0.784233689f,  -0.0682768822f,
    -0.31970498f,  -0.313387692f, 1.11018944f,   1.89667821f,   1.97297287f,   0.938631237f,
    -0.417800903f, -0.622365355f, -0.669461489f, -0.864707649f, 2.00791264f,   2.4945159f,
    2.20913815f,   1.51218224f,   -1.47093117f,  -1.35671842f,  -0.865589082f, 0.414934903f};
static const float ref32_rm2[3] = {0.030247679f, -0.0363386348f, -0.0373687968f};
static const float ref32_rv2[3] = {1.24114454f, 1.22043657f, 1.24094307f};
static const float ref32_yeval[48] = {
    -0.825844467f, -1.24376738f,  -1.71278608f, -1.88576043f,  5.28785706f,   4.77777672f,
    5.30847406f,   5.38062572f,   -2.91192269f, -0.502379f,    1.02684093f,   1.1565038f,
    -0.616483748f, -0.434636742f, -0.25262773f, -0.389279872f, -0.516012251f, 1.8350122f,
    2.57608342f,   2.89547729f,   -3.66480017f, -5.28795385f,  -5.69049883f,  -4.35443687f,
    -1.41831243f,  -1.27005267f,  -1.21984601f, -0.973195791f, -2.32671309f,  -4.13381863f,
    -3.65778065f,  -2.09767842f,  0.845987558f, 0.893990815f,  0.0869344398f, -2.07532334f,
    -1.73858023f,  -1.86012745f,  -1.74052489f, -1.70084584f,  5.52970171f,   5.38572168f,
    3.15092015f,   0.0952787846f, 0.9703812f,   1.00189447f,   1.17403126f,   2.2116282f};
static const float ref32_ytrain3[48] = {
    -0.816236436f, -1.14121628f,  -1.50592864f,  -1.64043486f,  4.01397896f,   3.62516999f,
    4.02969408f,   4.08469152f,   -2.88071036f,  -0.974199951f, 0.235769257f,  0.338362753f,
    -0.653436005f, -0.512030423f, -0.370498896f, -0.476760596f, -0.410020649f, 1.38204777f,
    1.94692934f,   2.19038725f,   -3.47641182f,  -4.76070452f,  -5.07921124f,  -4.02207518f,
    -1.2769438f,   -1.16165602f,  -1.12261486f,  -0.930817902f, -1.79022729f,  -3.16769361f,
    -2.80483365f,  -1.61564577f,  0.0926721171f, 0.130653858f,  -0.507915735f, -2.21876526f,
    -1.52598643f,  -1.62050235f,  -1.5274986f,   -1.4966439f,   4.19832468f,   4.08857584f,
    2.3850987f,    0.0559359528f, 0.191096455f,  0.216030777f,  0.352231085f,  1.17321181f};
static const double bn1d_y[15] = {0.36887765901310088, 0.42169296953961588,  0.32640079537906391,
                                  0.40595494670972243, 1.1480117176232241,   1.5094457274988815,
                                  0.87138476331788028, 0.20195061434226377,  0.27664434096756241,
                                  0.31248939582921537, 0.086107171108549901, -0.66709850725922826,
                                  -1.9587067648699179, -1.8577624726136539,  -1.4453923565862792};
static const double bn1d_rm[3] = {0.3334287026481933, 0.31064630443374358, 0.25769156323469022};
static const double bn1d_rv[3] = {1.0322702793422298, 1.0931823763742727, 1.1331968993686634};
static const double bn3d_y[48] = {
    0.15086105869735839,  0.16282857674662302,  -0.19401022468986381, 0.19924415418531319,
    1.1937517318985797,   1.5684803952522517,   0.80659535646718061,  -0.14906958468497339,
    -0.26813698167170869, 0.077278580271503847, -0.31349558679117201, -1.6741173231425541,
    0.46631427908118056,  0.32265147936326227,  0.50710723674948943,  0.12931813950238261,
    -0.79041279694499411, -1.3227801035721889,  -0.96889025445397481, -0.3763410048606744,
    -0.38368728213665199, -0.79351157386643234, -0.67147165462449465, 0.26729771969939425,
    -1.9146299209046012,  -1.6383124385659105,  -1.8318490700354684,  -1.3165631167830643,
    0.007489456397768492, 0.97007978191574462,  0.80466611115187936,  0.23747974139909792,
    0.39810880724475806,  1.1489194926847452,   1.281544932134997,    0.2928560708215121,
    2.0291652716239974,   1.8129370582811244,   1.9901881796468552,   1.638913716111168,
    0.58216952079500195,  -0.31628154655879148, -0.3813403814532087,  -0.081826675099811105,
    -0.31394576069218272, -1.0642548207770053,  -1.4121548936924331,  -0.86916385212101732};
static const double bn3d_rm[2] = {0.40498993971235536, -0.35081745793179198};
static const double bn3d_rv[2] = {0.86276044807430907, 0.97340403124611363};

static void data(double *out, int n, double k, double a) {
    for (int i = 0; i < n; i++) out[i] = sin(a * i + k) * 2.0 + 0.5 * cos(1.3 * i);
}

/* ---- gradient checks (training mode: a loss makes a training plan) ----- */

typedef struct bn_arg {
    int affine;
    double momentum, eps;
} bn_arg;

/* The layout train_step_relu and build_bn_cl build batch_norm in. */
static ts_layout layout = TS_CHANNELS_FIRST;

/* batch_norm (relu: fused batch_norm_relu) built channels last between
 * permutes when layout says so. */
static ts_val bn_in_layout(ts_graph *g, ts_val x, ts_val w, ts_val b, int relu) {
    if (layout == TS_CHANNELS_FIRST)
        return relu ? ts_batch_norm_relu(g, x, w, b, "bn", 0.1, 1e-5)
                    : ts_batch_norm(g, x, w, b, "bn", 0.1, 1e-5);
    int r = ts_rank(g, x);
    ts_val y = ts_batch_norm_layout(g, gc_to_layout(g, x, r, 1), w, b, "bn", 0.1, 1e-5, relu,
                                    TS_CHANNELS_LAST);
    return gc_to_layout(g, y, r, 0);
}

static ts_val build_bn(ts_graph *g, const ts_val *in, void *u) {
    const bn_arg *a = u;
    return ts_batch_norm(g, in[0], a->affine ? in[1] : TS_NONE, a->affine ? in[2] : TS_NONE, "bn",
                         a->momentum, a->eps);
}

/* Two layers sharing weight and bias, the second on y * y: dw and db add
 * up from two backward ops and dx flows through both. */
static ts_val build_two(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    ts_val y = ts_batch_norm(g, in[0], in[1], in[2], "bn1", 0.1, 1e-5);
    return ts_batch_norm(g, ts_mul(g, y, y), in[1], in[2], "bn2", 0.1, 1e-5);
}

static void gradchecks(void) {
    const struct {
        const char *label;
        gc_input x;
    } shapes[] = {
        {"1d [4,3]", GC_F(4, 3)},
        {"1d [3,2,5]", GC_F(3, 2, 5)},
        {"2d [2,3,4,5]", GC_F(2, 3, 4, 5)},
        {"3d [2,2,3,2,3]", GC_F(2, 2, 3, 2, 3)},
        {"N=1 [1,2,7]", GC_F(1, 2, 7)},
        {"C=1 [5,1,3]", GC_F(5, 1, 3)},
        {"size-1 spatial [3,2,1,1]", GC_F(3, 2, 1, 1)},
        {"two values per channel [2,3]", GC_F(2, 3)},
        {"several blocks [2,2,4099]", GC_F(2, 2, 4099)},
    };
    gc_options o = {.no_f32 = 1}; /* an f32 plan without a loss is eval mode: see train_f32 */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int affine = 0; affine < 2; affine++) {
            bn_arg a = {affine, 0.1, 1e-5};
            int64_t c = shapes[s].x.dims[1];
            gc_input in[3] = {shapes[s].x, GC_F(c), GC_F(c)};
            in[0].lo = -2, in[0].hi = 3;
            in[1].lo = 0.5, in[1].hi = 1.5;
            /* A small bias keeps the loss (a sum over up to 16k outputs)
             * small, so the finite differences keep their precision. */
            in[2].lo = -0.1, in[2].hi = 0.1;
            char label[128];
            snprintf(label, sizeof label, "batch_norm %s%s", shapes[s].label,
                     affine ? " affine" : "");
            gc_check_opt(label, 1 + 2 * affine, in, build_bn, &a, &o);
        }
    /* A large eps keeps a nearly constant channel well-conditioned. */
    bn_arg big = {1, 0.1, 0.5};
    gc_input near[3] = {GC_F(3, 2, 2), GC_F(2), GC_F(2)};
    near[0].lo = 0.999, near[0].hi = 1.001;
    gc_check_opt("batch_norm nearly constant x, eps 0.5", 3, near, build_bn, &big, &o);
    gc_input two[3] = {GC_F(4, 3, 5), GC_F(3), GC_F(3)};
    gc_check_opt("batch_norm twice, shared weight and bias", 3, two, build_two, NULL, &o);
}

/* ---- PyTorch parity: training steps, running stats, eval --------------- */

static void read_vals(ts_plan *p, const char *name, ts_dtype dt, double *out, int n) {
    float f[64];
    if (dt == TS_F64) {
        CHECK_OK(ts_plan_read(p, name, out, sizeof(double) * (size_t)n));
        return;
    }
    CHECK_OK(ts_plan_read(p, name, f, sizeof(float) * (size_t)n));
    for (int i = 0; i < n; i++) out[i] = f[i];
}

static void to_dt(void *dst, const double *src, int n, ts_dtype dt) {
    for (int i = 0; i < n; i++) {
        if (dt == TS_F64)
            ((double *)dst)[i] = src[i];
        else
            ((float *)dst)[i] = (float)src[i];
    }
}

static void expect(const char *what, const double *got, const double *want, int n, double tol) {
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= tol * (1 + fabs(want[i])))) {
            if (bad < 3) fprintf(stderr, "%s[%d] = %.10g, torch %.10g\n", what, i, got[i], want[i]);
            bad++;
        }
    CHECK(bad == 0, "%s: %d of %d values differ from PyTorch", what, bad, n);
}

static void parity(ts_dtype dt) {
    const int n = 48;
    /* torch.tensor([...]) is f32: the f64 module got these values rounded. */
    const double w0[3] = {1.5f, -0.5f, 0.75f}, b0[3] = {0.1f, 0.2f, -0.3f};
    double want[4][48], rstat[4][3];
    const float *f32s[] = {ref32_y1, ref32_y2, ref32_yeval, ref32_ytrain3};
    const double *f64s[] = {ref64_y1, ref64_y2, ref64_yeval, ref64_ytrain3};
    const float *f32r[] = {ref32_rm1, ref32_rv1, ref32_rm2, ref32_rv2};
    const double *f64r[] = {ref64_rm1, ref64_rv1, ref64_rm2, ref64_rv2};
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < n; i++) want[k][i] = dt == TS_F64 ? f64s[k][i] : f32s[k][i];
        for (int i = 0; i < 3; i++) rstat[k][i] = dt == TS_F64 ? f64r[k][i] : f32r[k][i];
    }
    double tol = dt == TS_F64 ? 1e-13 : 2e-6;
    const char *tag = dt == TS_F64 ? "f64" : "f32";
    char what[64];

    ts_graph *g = ts_graph_new();
    int64_t xd[4] = {4, 3, 2, 2}, cd[1] = {3};
    unsigned char wb[24], bb[24], rb[48 * 8], xb[48 * 8];
    double r[48], x[48];
    to_dt(wb, w0, 3, dt);
    to_dt(bb, b0, 3, dt);
    data(r, n, 0.3, 0.71);
    to_dt(rb, r, n, dt);
    ts_val xv = ts_input(g, "x", dt, 4, xd);
    ts_val w = ts_param(g, "bn.weight", dt, 1, cd, ts_init_buffer(wb));
    ts_val b = ts_param(g, "bn.bias", dt, 1, cd, ts_init_buffer(bb));
    ts_val y = ts_batch_norm(g, xv, w, b, "bn", 0.1, 1e-5);
    CHECK_OK(ts_mark_output(g, y, "y"));
    ts_val loss = ts_sum(g, ts_mul(g, y, ts_constant(g, "R", dt, 4, xd, rb)), 0, NULL, 0);
    CHECK_OK(ts_graph_status(g));
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_sgd(0.1, 0, 0, 0, 0);
    ts_plan *tp = NULL, *ep = NULL;
    CHECK_OK(ts_compile(g, &spec, NULL, &tp));
    CHECK_OK(ts_compile(g, NULL, NULL, &ep));
    if (!tp || !ep) goto out;
    double got[48], st[3];
    read_vals(tp, "bn.running_mean", dt, st, 3);
    for (int i = 0; i < 3; i++) CHECK(st[i] == 0, "running_mean starts at zero");
    read_vals(tp, "bn.running_var", dt, st, 3);
    for (int i = 0; i < 3; i++) CHECK(st[i] == 1, "running_var starts at one");
    for (int step = 1; step <= 2; step++) {
        data(x, n, step, 0.37);
        to_dt(xb, x, n, dt);
        CHECK_OK(ts_plan_set_input(tp, "x", xb, (size_t)n * ts_dtype_size(dt)));
        CHECK_OK(ts_plan_step(tp));
        read_vals(tp, "y", dt, got, n);
        snprintf(what, sizeof what, "%s train step %d: y", tag, step);
        expect(what, got, want[step - 1], n, tol);
        read_vals(tp, "bn.running_mean", dt, st, 3);
        snprintf(what, sizeof what, "%s running_mean after step %d", tag, step);
        expect(what, st, rstat[2 * (step - 1)], 3, tol);
        read_vals(tp, "bn.running_var", dt, st, 3);
        snprintf(what, sizeof what, "%s running_var after step %d", tag, step);
        expect(what, st, rstat[2 * (step - 1) + 1], 3, tol);
    }
    /* Eval: the inference plan gets the trained weights and statistics. */
    const char *names[4] = {"bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"};
    for (int k = 0; k < 4; k++) {
        unsigned char buf[24];
        size_t bytes = 3 * ts_dtype_size(dt);
        CHECK_OK(ts_plan_read(tp, names[k], buf, bytes));
        CHECK_OK(ts_plan_write_param(ep, names[k], buf, bytes));
    }
    data(x, n, 3, 0.37);
    to_dt(xb, x, n, dt);
    CHECK_OK(ts_plan_set_input(ep, "x", xb, (size_t)n * ts_dtype_size(dt)));
    CHECK_OK(ts_plan_step(ep));
    double ev[48];
    read_vals(ep, "y", dt, ev, n);
    snprintf(what, sizeof what, "%s eval plan: y", tag);
    expect(what, ev, want[2], n, tol);
    double before[3];
    read_vals(tp, "bn.running_mean", dt, before, 3);
    read_vals(ep, "bn.running_mean", dt, st, 3);
    CHECK(!memcmp(st, before, sizeof st), "%s: the eval plan must not change running_mean", tag);
    /* The same input in the training plan: batch statistics, other numbers. */
    CHECK_OK(ts_plan_set_input(tp, "x", xb, (size_t)n * ts_dtype_size(dt)));
    CHECK_OK(ts_plan_step(tp));
    double tr[48];
    read_vals(tp, "y", dt, tr, n);
    snprintf(what, sizeof what, "%s train plan on the eval input: y", tag);
    expect(what, tr, want[3], n, tol);
    double maxdiff = 0;
    for (int i = 0; i < n; i++) maxdiff = fmax(maxdiff, fabs(tr[i] - ev[i]));
    CHECK(maxdiff > 0.5, "%s: train and eval outputs should differ (max diff %g)", tag, maxdiff);
out:
    ts_plan_free(tp);
    ts_plan_free(ep);
    ts_graph_free(g);
}

/* 1d [N, C] and 3d without affine, momentum 0.3, eps 1e-3: one step. */
static void parity_1d_3d(void) {
    const struct {
        int rank;
        int64_t dims[5];
        const double *y, *rm, *rv;
    } cases[2] = {{2, {5, 3}, bn1d_y, bn1d_rm, bn1d_rv},
                  {5, {2, 2, 2, 3, 2}, bn3d_y, bn3d_rm, bn3d_rv}};
    for (int k = 0; k < 2; k++) {
        int n = 1, c = (int)cases[k].dims[1];
        for (int i = 0; i < cases[k].rank; i++) n *= (int)cases[k].dims[i];
        double x[64], y[64], st[3];
        data(x, n, 0.5, 0.23);
        ts_graph *g = ts_graph_new();
        ts_val xv = ts_input(g, "x", TS_F64, cases[k].rank, cases[k].dims);
        ts_val yv = ts_batch_norm(g, xv, TS_NONE, TS_NONE, "norm", 0.3, 1e-3);
        CHECK_OK(ts_mark_output(g, yv, "y"));
        ts_train_spec spec = ts_train_spec_default(ts_sum(g, yv, 0, NULL, 0));
        spec.opt.kind = TS_OPT_NONE;
        ts_plan *p = NULL;
        CHECK_OK(ts_compile(g, &spec, NULL, &p));
        if (p) {
            CHECK_OK(ts_plan_set_input(p, "x", x, sizeof(double) * (size_t)n));
            CHECK_OK(ts_plan_step(p));
            read_vals(p, "y", TS_F64, y, n);
            expect(k ? "3d y" : "1d y", y, cases[k].y, n, 1e-13);
            read_vals(p, "norm.running_mean", TS_F64, st, c);
            expect(k ? "3d running_mean" : "1d running_mean", st, cases[k].rm, c, 1e-13);
            read_vals(p, "norm.running_var", TS_F64, st, c);
            expect(k ? "3d running_var" : "1d running_var", st, cases[k].rv, c, 1e-13);
        }
        ts_plan_free(p);
        ts_graph_free(g);
    }
}

/* ---- f32 kernels, thread-count determinism ----------------------------- */

typedef struct run_out {
    double *y, *dx, *dw, *db, *rm, *rv;
} run_out;

/* One training step (no optimizer) of batch_norm on x; outputs as double.
 * relu: 0 plain, 1 relu(batch_norm) as two nodes, 2 the fused node. */
static void train_step_relu(ts_dtype dt, int rank, const int64_t *dims, const double *x,
                            const double *r, int threads, int relu, run_out *o) {
    int64_t n = 1, c = dims[1];
    for (int i = 0; i < rank; i++) n *= dims[i];
    size_t es = ts_dtype_size(dt);
    unsigned char *xb = malloc((size_t)n * es), *rb = malloc((size_t)n * es);
    unsigned char *buf = malloc((size_t)n * 8);
    double wv[64], bv[64];
    unsigned char wb[512], bb[512];
    for (int i = 0; i < c; i++) wv[i] = (i % 3 == 2 ? -1 : 1) * (1 + 0.1 * i), bv[i] = 0.05 * i;
    to_dt(xb, x, (int)n, dt);
    to_dt(rb, r, (int)n, dt);
    to_dt(wb, wv, (int)c, dt);
    to_dt(bb, bv, (int)c, dt);
    ts_graph *g = ts_graph_new();
    ts_val xv = ts_param(g, "x", dt, rank, dims, ts_init_buffer(xb));
    ts_val w = ts_param(g, "w", dt, 1, &c, ts_init_buffer(wb));
    ts_val b = ts_param(g, "b", dt, 1, &c, ts_init_buffer(bb));
    ts_val y = relu == 2   ? bn_in_layout(g, xv, w, b, 1)
               : relu == 1 ? ts_relu(g, bn_in_layout(g, xv, w, b, 0))
                           : bn_in_layout(g, xv, w, b, 0);
    CHECK_OK(ts_mark_output(g, y, "y"));
    ts_train_spec spec = ts_train_spec_default(
        ts_sum(g, ts_mul(g, y, ts_constant(g, "r", dt, rank, dims, rb)), 0, NULL, 0));
    spec.opt.kind = TS_OPT_NONE;
    ts_compile_options opt = ts_compile_options_default();
    opt.threads = threads;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, &opt, &p));
    if (p) {
        CHECK_OK(ts_plan_step(p));
        const char *names[6] = {"y",      "grad:x",          "grad:w",
                                "grad:b", "bn.running_mean", "bn.running_var"};
        double *dst[6] = {o->y, o->dx, o->dw, o->db, o->rm, o->rv};
        int64_t cnt[6] = {n, n, c, c, c, c};
        for (int k = 0; k < 6; k++) {
            CHECK_OK(ts_plan_read(p, names[k], buf, (size_t)cnt[k] * es));
            for (int64_t i = 0; i < cnt[k]; i++)
                dst[k][i] = dt == TS_F64 ? ((double *)buf)[i] : ((float *)buf)[i];
        }
    }
    ts_plan_free(p);
    ts_graph_free(g);
    free(xb);
    free(rb);
    free(buf);
}

static void train_step(ts_dtype dt, int rank, const int64_t *dims, const double *x, const double *r,
                       int threads, run_out *o) {
    train_step_relu(dt, rank, dims, x, r, threads, 0, o);
}

static run_out alloc_out(int64_t n, int64_t c) {
    run_out o = {calloc((size_t)n, 8), calloc((size_t)n, 8), calloc((size_t)c, 8),
                 calloc((size_t)c, 8), calloc((size_t)c, 8), calloc((size_t)c, 8)};
    return o;
}
static void free_out(run_out *o) {
    free(o->y), free(o->dx), free(o->dw), free(o->db), free(o->rm), free(o->rv);
}

static void kernels(void) {
    const struct {
        int rank;
        int64_t dims[5];
    } cases[] = {{3, {3, 2, 5000}}, {4, {16, 8, 12, 12}}, {2, {300, 7}}, {5, {2, 3, 4, 5, 6}}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int64_t n = 1, c = cases[k].dims[1];
        for (int i = 0; i < cases[k].rank; i++) n *= cases[k].dims[i];
        double *x = malloc((size_t)n * 8), *r = malloc((size_t)n * 8);
        for (int64_t i = 0; i < n; i++)
            x[i] = 3 + sin(0.013 * (double)i) * 2 + cos(0.7 * (double)i),
            r[i] = cos(0.3 * (double)i);
        run_out o64 = alloc_out(n, c), o32 = alloc_out(n, c), t1 = alloc_out(n, c),
                t2 = alloc_out(n, c);
        train_step(TS_F64, cases[k].rank, cases[k].dims, x, r, 0, &o64);
        train_step(TS_F32, cases[k].rank, cases[k].dims, x, r, 0, &o32);
        char what[64];
        snprintf(what, sizeof what, "case %zu f32 vs f64: y", k);
        expect(what, o32.y, o64.y, (int)n, 2e-5);
        snprintf(what, sizeof what, "case %zu f32 vs f64: dx", k);
        expect(what, o32.dx, o64.dx, (int)n, 2e-4);
        snprintf(what, sizeof what, "case %zu f32 vs f64: dw", k);
        expect(what, o32.dw, o64.dw, (int)c, 2e-4);
        snprintf(what, sizeof what, "case %zu f32 vs f64: running_var", k);
        expect(what, o32.rv, o64.rv, (int)c, 1e-5);
        for (int dt = 0; dt < 2; dt++) {
            ts_dtype d = dt ? TS_F32 : TS_F64;
            train_step(d, cases[k].rank, cases[k].dims, x, r, 1, &t1);
            train_step(d, cases[k].rank, cases[k].dims, x, r, 2, &t2);
            int same = !memcmp(t1.y, t2.y, (size_t)n * 8) && !memcmp(t1.dx, t2.dx, (size_t)n * 8) &&
                       !memcmp(t1.dw, t2.dw, (size_t)c * 8) &&
                       !memcmp(t1.db, t2.db, (size_t)c * 8) &&
                       !memcmp(t1.rm, t2.rm, (size_t)c * 8) && !memcmp(t1.rv, t2.rv, (size_t)c * 8);
            CHECK(same, "case %zu %s: 1 and 2 threads give different bits", k, dt ? "f32" : "f64");
        }
        free_out(&o64), free_out(&o32), free_out(&t1), free_out(&t2);
        free(x), free(r);
    }
}

/* ---- fused ReLU: gradient check, and the fused kernel against relu(bn) -- */

static ts_val build_bn_relu(ts_graph *g, const ts_val *in, void *u) {
    const bn_arg *a = u;
    return ts_batch_norm_relu(g, in[0], a->affine ? in[1] : TS_NONE, a->affine ? in[2] : TS_NONE,
                              "bn", a->momentum, a->eps);
}

static int same_bits(const run_out *a, const run_out *b, int64_t n, int64_t c) {
    return !memcmp(a->y, b->y, (size_t)n * 8) && !memcmp(a->dx, b->dx, (size_t)n * 8) &&
           !memcmp(a->dw, b->dw, (size_t)c * 8) && !memcmp(a->db, b->db, (size_t)c * 8) &&
           !memcmp(a->rm, b->rm, (size_t)c * 8) && !memcmp(a->rv, b->rv, (size_t)c * 8);
}

static void fused_relu(void) {
    gc_options o = {.no_f32 = 1};
    /* Small shapes only: with thousands of values per channel, moving one x
     * by the finite-difference step shifts the statistics enough to carry
     * some other output across the ReLU's kink, and the numeric gradient
     * drifts by ~1e-6; the big cases are covered below against relu(bn). */
    const gc_input shapes[] = {GC_F(4, 3), GC_F(2, 3, 4, 5), GC_F(2, 2, 3, 2, 3), GC_F(3, 2, 40)};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int affine = 0; affine < 2; affine++) {
            bn_arg a = {affine, 0.1, 1e-5};
            int64_t c = shapes[s].dims[1];
            gc_input in[3] = {shapes[s], GC_F(c), GC_F(c)};
            in[0].lo = -2, in[0].hi = 3;
            in[1].lo = 0.5, in[1].hi = 1.5;
            in[2].lo = -0.1, in[2].hi = 0.1;
            char label[96];
            snprintf(label, sizeof label, "batch_norm_relu case %zu%s", s, affine ? " affine" : "");
            gc_check_opt(label, 1 + 2 * affine, in, build_bn_relu, &a, &o);
        }
    /* Random shapes: the fused node matches the two-node reference (the
     * same arithmetic, so the same bits) and is thread-count independent. */
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (int k = 0; k < 7; k++) {
        /* rank 2..5 with random extents; N >= 2 so training has two values
         * per channel; the last case is big enough to run in parallel. */
        int rank = 2 + k % 4;
        int64_t dims[5], n = 1;
        for (int i = 0; i < rank; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            int64_t lim = i == 0 ? 3 : i == 1 ? 5 : 12;
            dims[i] = (i == 0 ? 2 : 1) + (int64_t)((st >> 33) % (uint64_t)lim);
        }
        if (k == 6) dims[0] = 3, dims[1] = 4, dims[2] = 40, dims[3] = 41;
        for (int i = 0; i < rank; i++) n *= dims[i];
        int64_t c = dims[1];
        double *x = malloc((size_t)n * 8), *r = malloc((size_t)n * 8);
        for (int64_t i = 0; i < n; i++)
            x[i] = sin(0.37 * (double)i + k) * 2 + 0.3 * cos(1.7 * (double)i),
            r[i] = cos(0.3 * (double)i + k);
        run_out ref = alloc_out(n, c), f1 = alloc_out(n, c), f2 = alloc_out(n, c);
        for (int dt = 0; dt < 2; dt++) {
            ts_dtype d = dt ? TS_F32 : TS_F64;
            train_step_relu(d, rank, dims, x, r, 1, 1, &ref);
            train_step_relu(d, rank, dims, x, r, 1, 2, &f1);
            train_step_relu(d, rank, dims, x, r, 2, 2, &f2);
            int zeros = 0;
            for (int64_t i = 0; i < n; i++) zeros += ref.y[i] == 0;
            CHECK(zeros > 0 && zeros < n, "case %d: the ReLU clips %d of %lld values", k, zeros,
                  (long long)n);
            CHECK(same_bits(&ref, &f1, n, c),
                  "case %d %s: fused batch_norm_relu differs from relu(batch_norm)", k,
                  dt ? "f32" : "f64");
            CHECK(same_bits(&f1, &f2, n, c), "case %d %s: fused, 1 and 2 threads differ", k,
                  dt ? "f32" : "f64");
        }
        free_out(&ref), free_out(&f1), free_out(&f2);
        free(x), free(r);
    }
}

/* ---- channels last ----------------------------------------------------- */

typedef struct cl_arg {
    int affine, relu;
} cl_arg;

static ts_val build_bn_cl(ts_graph *g, const ts_val *in, void *u) {
    const cl_arg *a = u;
    int r = ts_rank(g, in[0]);
    ts_val w = a->affine ? in[1] : TS_NONE, b = a->affine ? in[2] : TS_NONE;
    ts_val y = ts_batch_norm_layout(g, gc_to_layout(g, in[0], r, 1), w, b, "bn", 0.1, 1e-5, a->relu,
                                    TS_CHANNELS_LAST);
    return gc_to_layout(g, y, r, 0);
}

static int close_to(const double *a, const double *b, int64_t n, double tol) {
    double mx = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(a[i]));
        worst = fmax(worst, fabs(a[i] - b[i]));
    }
    return worst <= tol * fmax(mx, 1e-30);
}

/* Gradient checks of the channels-last kernels (plain and fused ReLU), and
 * a training step against channels first: the same statistics summed in
 * another order, so equal to rounding; and the same bits at 1 and 2
 * threads. */
static void channels_last(void) {
    gc_options o = {.no_f32 = 1};
    const gc_input shapes[] = {GC_F(4, 3), GC_F(3, 2, 5), GC_F(2, 3, 4, 5), GC_F(2, 2, 3, 2, 3),
                               GC_F(2, 2, 4099)};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int k = 0; k < 4; k++) {
            cl_arg a = {k & 1, k >> 1};
            if (a.relu && s == 4) continue; /* the ReLU's kink: see fused_relu */
            int64_t c = shapes[s].dims[1];
            gc_input in[3] = {shapes[s], GC_F(c), GC_F(c)};
            in[0].lo = -2, in[0].hi = 3;
            in[1].lo = 0.5, in[1].hi = 1.5;
            in[2].lo = -0.1, in[2].hi = 0.1;
            char label[96];
            snprintf(label, sizeof label, "batch_norm%s channels last, case %zu%s",
                     a.relu ? "_relu" : "", s, a.affine ? " affine" : "");
            gc_check_opt(label, 1 + 2 * a.affine, in, build_bn_cl, &a, &o);
        }
    const struct {
        int rank;
        int64_t dims[5];
    } cases[] = {{3, {3, 2, 5000}}, {4, {4, 16, 12, 12}}, {5, {2, 20, 4, 5, 6}}, {2, {300, 7}}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int64_t n = 1, c = cases[k].dims[1];
        for (int i = 0; i < cases[k].rank; i++) n *= cases[k].dims[i];
        double *x = malloc((size_t)n * 8), *r = malloc((size_t)n * 8);
        for (int64_t i = 0; i < n; i++)
            x[i] = sin(0.37 * (double)i + k) * 2 + 0.3 * cos(1.7 * (double)i),
            r[i] = cos(0.3 * (double)i + k);
        for (int dt = 0; dt < 2; dt++)
            for (int relu = 0; relu < 3; relu += 2) {
                ts_dtype d = dt ? TS_F32 : TS_F64;
                double tol = dt ? 2e-5 : 1e-12;
                run_out cf = alloc_out(n, c), c1 = alloc_out(n, c), c2 = alloc_out(n, c);
                layout = TS_CHANNELS_FIRST;
                train_step_relu(d, cases[k].rank, cases[k].dims, x, r, 2, relu, &cf);
                layout = TS_CHANNELS_LAST;
                train_step_relu(d, cases[k].rank, cases[k].dims, x, r, 1, relu, &c1);
                train_step_relu(d, cases[k].rank, cases[k].dims, x, r, 2, relu, &c2);
                layout = TS_CHANNELS_FIRST;
                const char *dn = dt ? "f32" : "f64";
                CHECK(close_to(cf.y, c1.y, n, tol) && close_to(cf.dx, c1.dx, n, tol) &&
                          close_to(cf.dw, c1.dw, c, tol) && close_to(cf.db, c1.db, c, tol),
                      "case %zu %s relu %d: channels last differs from channels first", k, dn,
                      relu);
                CHECK(close_to(cf.rm, c1.rm, c, tol) && close_to(cf.rv, c1.rv, c, tol),
                      "case %zu %s: channels-last running statistics differ", k, dn);
                CHECK(same_bits(&c1, &c2, n, c),
                      "case %zu %s: channels last, 1 and 2 threads differ", k, dn);
                free_out(&cf), free_out(&c1), free_out(&c2);
            }
        free(x), free(r);
    }
}

/* ---- the node survives simplify and runs once per step ----------------- */

static void side_effect(void) {
    /* The first layer's y is unused (dead code but for its state update);
     * the other two read the same x with the same attributes. Each must
     * run exactly once per step. */
    ts_graph *g = ts_graph_new();
    int64_t xd[2] = {4, 2}, wd[1] = {2};
    double x[8] = {1, 2, 3, 5, -1, 0, 2, 2}, want_rm[2] = {0.125, 0.225};
    ts_val xv = ts_input(g, "x", TS_F64, 2, xd);
    ts_val w = ts_param(g, "w", TS_F64, 1, wd, ts_init_ones());
    ts_batch_norm(g, xv, TS_NONE, TS_NONE, "unused", 0.1, 1e-5);
    ts_val a = ts_batch_norm(g, xv, TS_NONE, TS_NONE, "a", 0.1, 1e-5);
    ts_val b = ts_batch_norm(g, xv, TS_NONE, TS_NONE, "b", 0.1, 1e-5);
    ts_val loss = ts_sum(g, ts_mul(g, ts_add(g, a, b), w), 0, NULL, 0);
    ts_train_spec spec = ts_train_spec_default(loss);
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, NULL, &p));
    if (p) {
        CHECK_OK(ts_plan_set_input(p, "x", x, sizeof x));
        for (int s = 0; s < 2; s++) CHECK_OK(ts_plan_step(p));
        /* mean of x per channel (1.25, 2.25); after two steps with 0.1:
         * 0.1 m + 0.9 * 0.1 m = 0.19 m. */
        want_rm[0] = 0.19 * 1.25, want_rm[1] = 0.19 * 2.25;
        const char *names[3] = {"unused.running_mean", "a.running_mean", "b.running_mean"};
        for (int k = 0; k < 3; k++) {
            double st[2] = {0};
            CHECK_OK(ts_plan_read(p, names[k], st, sizeof st));
            CHECK(fabs(st[0] - want_rm[0]) < 1e-15 && fabs(st[1] - want_rm[1]) < 1e-15,
                  "%s = (%g, %g) after two steps, expected (%g, %g)", names[k], st[0], st[1],
                  want_rm[0], want_rm[1]);
        }
        ts_plan_free(p);
    }
    ts_graph_free(g);
}

/* ---- errors ------------------------------------------------------------ */

static void expect_build_error(ts_graph *g, const char *needle) {
    CHECK(ts_graph_status(g) != TS_OK, "expected a build error containing '%s'", needle);
    CHECK(strstr(ts_graph_error(g), needle) != NULL, "error '%s' should mention '%s'",
          ts_graph_error(g), needle);
}

static void errors(void) {
    int64_t d1[1] = {6}, d3[3] = {2, 3, 4}, c2[1] = {2}, c3[1] = {3};
    ts_graph *g = ts_graph_new();
    ts_batch_norm(g, ts_input(g, "x", TS_F32, 1, d1), TS_NONE, TS_NONE, "bn", 0.1, 1e-5);
    expect_build_error(g, "batch_norm(x=f32[6])");
    ts_graph_free(g);

    g = ts_graph_new();
    ts_val x = ts_input(g, "x", TS_F32, 3, d3);
    ts_batch_norm(g, x, ts_param(g, "w", TS_F32, 1, c2, ts_init_ones()),
                  ts_param(g, "b", TS_F32, 1, c2, ts_init_zeros()), "bn", 0.1, 1e-5);
    expect_build_error(g, "weight must be f32[3]");
    ts_graph_free(g);

    g = ts_graph_new();
    x = ts_input(g, "x", TS_F32, 3, d3);
    ts_batch_norm(g, x, ts_param(g, "w", TS_F32, 1, c3, ts_init_ones()), TS_NONE, "bn", 0.1, 1e-5);
    expect_build_error(g, "both weight and bias or neither");
    ts_graph_free(g);

    g = ts_graph_new();
    x = ts_input(g, "x", TS_F32, 3, d3);
    ts_batch_norm(g, x, TS_NONE, TS_NONE, "bn", 0.1, 1e-5);
    ts_batch_norm(g, x, TS_NONE, TS_NONE, "bn", 0.1, 1e-5);
    expect_build_error(g, "'bn.running_mean' is already used");
    ts_graph_free(g);

    g = ts_graph_new();
    x = ts_input(g, "x", TS_F32, 3, d3);
    ts_batch_norm(g, x, TS_NONE, TS_NONE, "bn", 1.5, 1e-5);
    expect_build_error(g, "momentum 1.5 is not in [0, 1]");
    ts_graph_free(g);

    /* One value per channel cannot be normalised in training (as torch). */
    g = ts_graph_new();
    int64_t one[3] = {1, 3, 1};
    ts_val xo = ts_input(g, "x", TS_F64, 3, one);
    ts_val w = ts_param(g, "w", TS_F64, 1, c3, ts_init_ones());
    ts_val y =
        ts_batch_norm(g, xo, w, ts_param(g, "b", TS_F64, 1, c3, ts_init_zeros()), "bn", 0.1, 1e-5);
    ts_train_spec spec = ts_train_spec_default(ts_sum(g, y, 0, NULL, 0));
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, NULL, &p));
    if (p) {
        CHECK(ts_plan_step(p) != TS_OK, "training on one value per channel must fail");
        CHECK(strstr(ts_last_error(), "more than one value per channel") != NULL, "message: %s",
              ts_last_error());
        ts_plan_free(p);
    }
    /* ... but eval mode is fine. */
    CHECK_OK(ts_mark_output(g, y, "y"));
    CHECK_OK(ts_compile(g, NULL, NULL, &p));
    if (p) {
        CHECK_OK(ts_plan_step(p));
        ts_plan_free(p);
    }
    ts_graph_free(g);
}

int main(void) {
    gradchecks();
    parity(TS_F64);
    parity(TS_F32);
    parity_1d_3d();
    kernels();
    side_effect();
    fused_relu();
    channels_last();
    errors();
    return check_summary("gradcheck_batchnorm");
}
