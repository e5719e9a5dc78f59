//! `attnscope bench sdpa`: times the fused attention kernel on random inputs (made, and checked
//! by `AttnInput::new`, before the timed calls) and prints the median
//! time and GFLOP/s (FLOPs = 4·batch·n_heads·seq_q·seq_kv·head_dim, halved when causal — the
//! count `shared/bench/sdpa_torch.py` uses, times 3.5 with `--backward`), plus the process's
//! peak memory. `--backward` times the forward pass plus [`attn_core::sdpa_backward`] (f32 only);
//! `--mask` adds a mask (`scripts/sdpa_torch_kv.py --mask` makes the same kind for PyTorch).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use attn_core::f32_bytes;
use attn_core::{
    AttnInput, AttnOptions, AttnOutput, AttnShape, BoolMask, Causal, FloatMask, KeyPadding,
    WeightsRequest,
};
use attn_core::{Isa, bf16};

/// How long the untimed calls before the timed ones run (at least one call). After the inputs
/// are made on one thread, the first calls can run on one: on a virtual machine an idle vCPU
/// took up to 4 calls of 6–12 ms to come back (measured at L=S=2048 bf16 causal).
const WARM_UP: Duration = Duration::from_millis(250);

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Dtype {
    F32,
    Bf16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MaskArg {
    /// No mask.
    None,
    /// An additive mask over [seq, seq-kv]: normal values times 0.5.
    Float,
    /// A boolean mask over [seq, seq-kv]: each key visible with probability 0.9.
    Bool,
    /// Key padding: the last tenth of each sequence's keys hidden.
    Padding,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightsArg {
    /// No weights.
    None,
    /// The weights of one query row (the middle one) of every head.
    Row,
    /// Every row's weights.
    All,
}

#[derive(clap::Args)]
pub struct Args {
    /// Query length (and key length unless --seq-kv is given).
    #[arg(long)]
    seq: usize,
    /// Key/value length [default: --seq].
    #[arg(long)]
    seq_kv: Option<usize>,
    /// Batch size.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Query heads.
    #[arg(long)]
    heads: usize,
    /// Key/value heads for grouped-query attention [default: as many as --heads]
    ///
    /// Key/value heads, each shared by `heads / kv_heads` query heads (grouped-query attention;
    /// default: as many as --heads).
    #[arg(long)]
    kv_heads: Option<usize>,
    /// Dimension of each head's queries, keys and values.
    #[arg(long)]
    head_dim: usize,
    /// Causal mask (bottom-right aligned when --seq-kv differs from --seq).
    #[arg(long)]
    causal: bool,
    /// Element type of q, k and v (bf16 accumulates in f32).
    #[arg(long, value_enum, default_value_t = Dtype::F32)]
    dtype: Dtype,
    /// Worker threads (rayon's global pool).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Attention weights to return as well, recomputed from the saved log-sum-exp.
    #[arg(long, value_enum, default_value_t = WeightsArg::None)]
    weights: WeightsArg,
    /// Timed repetitions, after 0.25 s of untimed calls (at least one); the median is reported.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Time the forward and the backward pass (gradients of q, k, v for a random dout).
    #[arg(long)]
    backward: bool,
    /// A mask over the scores, as scripts/sdpa_torch_kv.py --mask makes it for PyTorch.
    #[arg(long, value_enum, default_value_t = MaskArg::None)]
    mask: MaskArg,
    /// Print one JSON object instead of a line of text.
    #[arg(long)]
    json: bool,
}

/// Checks the flags, makes the inputs, times the calls and prints the result.
pub fn run(args: Args) -> anyhow::Result<()> {
    let kv_heads = check_flags(&args)?;
    crate::maps::set_threads(args.threads)?;
    let seq_kv = args.seq_kv.unwrap_or(args.seq);
    let shape = AttnShape {
        n_kv_heads: kv_heads,
        ..AttnShape::new(args.batch, args.heads, args.seq, seq_kv, args.head_dim)
    };
    let mut options = AttnOptions {
        causal: args.causal.then_some(Causal::BottomRight),
        weights: match args.weights {
            WeightsArg::None => WeightsRequest::None,
            WeightsArg::Row => WeightsRequest::Rows(vec![args.seq / 2]),
            WeightsArg::All => WeightsRequest::All,
        },
        ..AttnOptions::default()
    };
    // Refuse impossible requests before allocating the inputs: first what this machine cannot
    // hold, in the flags' words, then what no call may ask for.
    check_memory(&args, shape)?;
    options.validate(&shape)?;
    let (nq, nk) = (numel(shape.q_dims())?, numel(shape.k_dims())?);
    let mut rng = Rng(0x5eed);
    add_mask(&args, seq_kv, &mut rng, &mut options)?;
    let inputs = Inputs::random(nq, nk, args.dtype, &mut rng);
    let call = make_call(&args, shape, options, &inputs, &mut rng)?;
    let (median, out_bytes) = time_calls(call, args.reps)?;
    let figures = Figures::new(&args, seq_kv, (nq, nk), median, out_bytes);
    if args.json {
        print_json(&args, shape, &figures)
    } else {
        print_line(&args, shape, &figures)
    }
}

/// Refuses a zero size, heads that do not divide into key/value heads and a bf16
/// `--backward`; returns the key/value heads.
fn check_flags(args: &Args) -> anyhow::Result<usize> {
    super::check_reps(args.reps)?;
    let kv_heads = args.kv_heads.unwrap_or(args.heads);
    for (flag, value) in [
        ("--seq", args.seq),
        ("--seq-kv", args.seq_kv.unwrap_or(args.seq)),
        ("--heads", args.heads),
        ("--kv-heads", kv_heads),
        ("--head-dim", args.head_dim),
        ("--batch", args.batch),
    ] {
        if value == 0 {
            bail!("{flag} must be at least 1");
        }
    }
    if !args.heads.is_multiple_of(kv_heads) {
        bail!(
            "--heads ({}) must be a multiple of --kv-heads ({kv_heads})",
            args.heads
        );
    }
    if args.backward && args.dtype != Dtype::F32 {
        bail!("--backward needs --dtype f32");
    }
    Ok(kv_heads)
}

/// The number of elements of a tensor of `dims`, refusing one that overflows.
fn numel(dims: [usize; 4]) -> anyhow::Result<usize> {
    (dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d))).context("the inputs' size overflows")
}

/// Adds the `--mask` to `options`, its random values drawn from `rng`.
fn add_mask(
    args: &Args,
    seq_kv: usize,
    rng: &mut Rng,
    options: &mut AttnOptions,
) -> anyhow::Result<()> {
    let scores = args.seq * seq_kv;
    match args.mask {
        MaskArg::None => {}
        MaskArg::Float => {
            let data = (0..scores).map(|_| 0.5 * rng.normal()).collect();
            options.float_mask = Some(FloatMask::from_vec(data, &[args.seq, seq_kv])?);
        }
        MaskArg::Bool => {
            let data = (0..scores)
                .map(|_| !rng.next_u64().is_multiple_of(10))
                .collect();
            options.bool_mask = Some(BoolMask::from_vec(data, &[args.seq, seq_kv])?);
        }
        MaskArg::Padding => {
            let lengths = vec![seq_kv - seq_kv / 10; args.batch];
            options.key_padding = Some(KeyPadding::from_lengths(&lengths, seq_kv)?);
        }
    }
    Ok(())
}

/// The random q, k and v, and for `--dtype bf16` their bf16 copies.
struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Empty for `--dtype f32`.
    qb: Vec<bf16>,
    kb: Vec<bf16>,
    vb: Vec<bf16>,
}

impl Inputs {
    /// Draws `nq` query and `nk` key and value elements from `rng`.
    fn random(nq: usize, nk: usize, dtype: Dtype, rng: &mut Rng) -> Inputs {
        let q: Vec<f32> = (0..nq).map(|_| rng.normal()).collect();
        let k: Vec<f32> = (0..nk).map(|_| rng.normal()).collect();
        let v: Vec<f32> = (0..nk).map(|_| rng.normal()).collect();
        // Both dtypes make (and check) their inputs once, before the calls that are timed.
        let to_bf16 = |x: &[f32]| x.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
        let (qb, kb, vb) = match dtype {
            Dtype::Bf16 => (to_bf16(&q), to_bf16(&k), to_bf16(&v)),
            Dtype::F32 => Default::default(),
        };
        Inputs {
            q,
            k,
            v,
            qb,
            kb,
            vb,
        }
    }
}

/// One timed call: the forward pass on the dtype's inputs, and with `--backward` the backward
/// pass for a random `dout` too.
type Call<'a> = Box<dyn FnMut() -> anyhow::Result<AttnOutput> + 'a>;

/// The call the benchmark times, its inputs checked (and `dout` drawn from `rng`) now.
fn make_call<'a>(
    args: &Args,
    shape: AttnShape,
    options: AttnOptions,
    inputs: &'a Inputs,
    rng: &mut Rng,
) -> anyhow::Result<Call<'a>> {
    let Inputs {
        q,
        k,
        v,
        qb,
        kb,
        vb,
    } = inputs;
    Ok(match args.dtype {
        Dtype::F32 if args.backward => {
            let input = AttnInput::new(q, k, v, shape)?;
            let dout: Vec<f32> = (0..numel(shape.out_dims())?)
                .map(|_| rng.normal())
                .collect();
            Box::new(move || {
                let fwd = attn_core::sdpa(&input, &options)?;
                let grads = attn_core::sdpa_backward(&input, &options, &fwd, &dout)?;
                drop(grads);
                Ok(fwd)
            })
        }
        Dtype::F32 => {
            let input = AttnInput::new(q, k, v, shape)?;
            Box::new(move || Ok(attn_core::sdpa(&input, &options)?))
        }
        Dtype::Bf16 => {
            let input = AttnInput::new(qb, kb, vb, shape)?;
            Box::new(move || Ok(attn_core::sdpa(&input, &options)?))
        }
    })
}

/// Runs `call` untimed for [`WARM_UP`], then `reps` timed times; returns the median time in
/// seconds and the bytes of one call's outputs.
fn time_calls(mut call: Call<'_>, reps: usize) -> anyhow::Result<(f64, usize)> {
    let warm_up = Instant::now();
    let first = call()?;
    let out_bytes = 4
        * (first.out.len()
            + first.lse.len()
            + first.weights.as_ref().map_or(0, |w| w.data().len()));
    drop(first);
    while warm_up.elapsed() < WARM_UP {
        drop(call()?);
    }
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        let out = call()?;
        times.push(t.elapsed().as_secs_f64());
        drop(out);
    }
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], out_bytes))
}

/// What the benchmark reports besides the flags.
struct Figures {
    seq_kv: usize,
    /// The median time of a call, in seconds.
    median: f64,
    gflops: f64,
    in_mib: f64,
    out_mib: f64,
    peak_mib: Option<f64>,
}

impl Figures {
    /// The GFLOP/s of a call of `median` seconds, the inputs' (`nq` query and `nk` key
    /// elements) and outputs' size, and the process's peak memory now.
    fn new(
        args: &Args,
        seq_kv: usize,
        (nq, nk): (usize, usize),
        median: f64,
        out_bytes: usize,
    ) -> Figures {
        let flops = 4.0
            * (args.batch * args.heads) as f64
            * args.seq as f64
            * seq_kv as f64
            * args.head_dim as f64
            * if args.causal { 0.5 } else { 1.0 }
            * if args.backward { 3.5 } else { 1.0 };
        let elem = if args.dtype == Dtype::F32 { 4 } else { 2 };
        Figures {
            seq_kv,
            median,
            gflops: flops / median / 1e9,
            in_mib: (elem * (nq + 2 * nk)) as f64 / (1 << 20) as f64,
            out_mib: out_bytes as f64 / (1 << 20) as f64,
            peak_mib: peak_rss_mib(),
        }
    }
}

/// Prints the result as one JSON object.
fn print_json(args: &Args, shape: AttnShape, figures: &Figures) -> anyhow::Result<()> {
    let report = serde_json::json!({
        "impl": "attnscope-fused",
        "dtype": super::spelled(args.dtype),
        "batch": args.batch,
        "seq": args.seq,
        "seq_kv": figures.seq_kv,
        "heads": args.heads,
        "kv_heads": shape.n_kv_heads,
        "head_dim": args.head_dim,
        "causal": args.causal,
        "backward": args.backward,
        "mask": super::spelled(args.mask),
        "threads": args.threads,
        "weights": super::spelled(args.weights),
        "isa": format!("{:?}", forward_isa(args.dtype, args.seq)),
        "reps": args.reps,
        "ms": figures.median * 1e3,
        "gflops": figures.gflops,
        "inputs_mib": figures.in_mib,
        "outputs_mib": figures.out_mib,
        "peak_rss_mib": figures.peak_mib,
    });
    crate::outln!("{report}")?;
    Ok(())
}

/// Prints the result as one line of text.
fn print_line(args: &Args, shape: AttnShape, figures: &Figures) -> anyhow::Result<()> {
    crate::outln!(
        "sdpa{} {} B{} H{}{} L{} S{} d{}{}{} weights={} threads={}: {:.3} ms (median of {}), \
         {:.1} GFLOP/s; inputs {:.1} MiB, outputs {:.1} MiB, peak RSS {}",
        if args.backward {
            " forward+backward"
        } else {
            ""
        },
        super::spelled(args.dtype),
        args.batch,
        args.heads,
        if shape.n_kv_heads == args.heads {
            String::new()
        } else {
            format!(" KV{}", shape.n_kv_heads)
        },
        args.seq,
        figures.seq_kv,
        args.head_dim,
        if args.causal { " causal" } else { "" },
        match args.mask {
            MaskArg::None => String::new(),
            mask => format!(" mask={}", super::spelled(mask)),
        },
        super::spelled(args.weights),
        args.threads,
        figures.median * 1e3,
        super::runs(args.reps),
        figures.gflops,
        figures.in_mib,
        figures.out_mib,
        figures
            .peak_mib
            .map_or("unknown".into(), |m| format!("{m:.1} MiB")),
    )?;
    Ok(())
}

/// Refuses a case whose inputs and outputs alone would not fit in this machine's memory
/// (where `/proc/meminfo` tells it), before anything is allocated: the f32 inputs (made for
/// both dtypes), their bf16 copies, a mask, the output and log-sum-exp, and with `--backward`
/// the output's gradient and the three input gradients.
fn check_memory(args: &Args, shape: AttnShape) -> anyhow::Result<()> {
    // Every size saturates: the flags can ask for more than u128 holds.
    let inputs =
        f32_bytes(&shape.q_dims()).saturating_add(f32_bytes(&shape.k_dims()).saturating_mul(2));
    let out = f32_bytes(&shape.out_dims());
    let scores = f32_bytes(&[shape.seq_q, shape.seq_kv]);
    let mask = match args.mask {
        MaskArg::None | MaskArg::Padding => 0,
        MaskArg::Float => scores,
        MaskArg::Bool => scores / 4,
    };
    let mut bytes = [inputs, out, f32_bytes(&shape.out_dims()[..3]), mask]
        .into_iter()
        .fold(0u128, u128::saturating_add);
    if args.dtype == Dtype::Bf16 {
        bytes = bytes.saturating_add(inputs / 2);
    }
    if args.backward {
        bytes = bytes.saturating_add(out).saturating_add(inputs);
    }
    let Some(total) = physical_memory() else {
        return Ok(());
    };
    if bytes > total {
        bail!(
            "--seq {} --heads {} --head-dim {} (batch {}, {} key/value heads, {} keys) would need \
             {:.1} GiB for the inputs{} and outputs alone; this machine has {:.1} GiB",
            args.seq,
            args.heads,
            args.head_dim,
            shape.batch,
            shape.n_kv_heads,
            shape.seq_kv,
            bytes as f64 / (1u64 << 30) as f64,
            match mask {
                0 => String::new(),
                mask => format!(
                    ", the --mask ({:.1} GiB)",
                    mask as f64 / (1u64 << 30) as f64
                ),
            },
            total as f64 / (1u64 << 30) as f64,
        );
    }
    Ok(())
}

/// The machine's memory in bytes (`MemTotal`), where `/proc` tells it.
fn physical_memory() -> Option<u128> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u128 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The process's peak resident memory (`VmHWM`), where `/proc` tells it.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// A small deterministic generator (SplitMix64), so every run times the same inputs.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A standard normal value (Box–Muller), like the `torch.randn` inputs of the PyTorch side.
    fn normal(&mut self) -> f32 {
        let u1 = ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }
}

/// The kernels the forward pass runs on for `dtype`: on AMX machines, f32 inputs take the tiles
/// (in three bf16 parts) for calls of at least 32 query rows whose scores stay within the
/// tiles' bound, as these random inputs' do (up to `head_dim` 256); shorter calls run the
/// AVX-512 kernels, and so do f32 inputs where the CPU has bf16 dot products but no AMX.
fn forward_isa(dtype: Dtype, seq: usize) -> Isa {
    match (Isa::best(), dtype) {
        (Isa::Amx, Dtype::F32) if seq < 32 => Isa::Avx512,
        (Isa::Avx512Bf16, Dtype::F32) => Isa::Avx512,
        (isa, _) => isa,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small valid run; each test changes what it needs.
    fn args() -> Args {
        Args {
            seq: 70,
            seq_kv: Some(33),
            batch: 2,
            heads: 4,
            kv_heads: Some(2),
            head_dim: 40,
            causal: true,
            dtype: Dtype::F32,
            // The size rayon's global pool takes by default, so any test order agrees on it.
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            weights: WeightsArg::Row,
            reps: 2,
            json: true,
            backward: false,
            mask: MaskArg::None,
        }
    }

    #[test]
    fn the_reported_isa_is_the_one_each_dtype_runs_on() {
        // bf16 inputs take the best kernels; f32 ones too from 32 query rows, the AVX-512
        // kernels below that on AMX machines, and always where the best are the bf16 dot
        // products (which take bf16 inputs only).
        for seq in [1, 31, 32, 2048] {
            assert_eq!(forward_isa(Dtype::Bf16, seq), Isa::best());
        }
        let (short, long) = match Isa::best() {
            Isa::Amx => (Isa::Avx512, Isa::Amx),
            Isa::Avx512Bf16 => (Isa::Avx512, Isa::Avx512),
            best => (best, best),
        };
        assert_eq!(forward_isa(Dtype::F32, 31), short);
        assert_eq!(forward_isa(Dtype::F32, 32), long);
    }

    /// A mask of 10¹² scores (4 TB) is refused before anything is allocated, naming the mask's
    /// share (where `/proc/meminfo` tells the machine's memory, as on the machines this runs on).
    #[test]
    fn a_mask_larger_than_the_machine_is_refused_naming_it() {
        assert!(
            physical_memory().is_some(),
            "no /proc/meminfo to check against"
        );
        let a = Args {
            seq: 1_000_000,
            seq_kv: None,
            batch: 1,
            heads: 1,
            kv_heads: None,
            head_dim: 8,
            weights: WeightsArg::None,
            mask: MaskArg::Float,
            ..args()
        };
        let msg = format!("{:#}", run(a).unwrap_err());
        assert!(msg.contains("the --mask (3725.3 GiB)"), "{msg}");
    }

    #[test]
    fn small_runs_succeed() {
        run(args()).unwrap();
        for mask in [MaskArg::Float, MaskArg::Bool, MaskArg::Padding] {
            run(Args { mask, ..args() }).unwrap();
        }
        run(Args {
            dtype: Dtype::Bf16,
            weights: WeightsArg::All,
            json: false,
            ..args()
        })
        .unwrap();
    }

    #[test]
    fn bad_flags_are_refused() {
        let err = |a: Args| format!("{:#}", run(a).unwrap_err());
        assert!(err(Args { reps: 0, ..args() }).contains("--reps"));
        assert!(err(Args { seq: 0, ..args() }).contains("--seq"));
        for kv_heads in [0, 3] {
            let msg = err(Args {
                kv_heads: Some(kv_heads),
                ..args()
            });
            assert!(msg.contains("--kv-heads"), "{msg}");
        }
        assert!(
            err(Args {
                threads: 0,
                ..args()
            })
            .contains("--threads")
        );
        assert!(
            err(Args {
                backward: true,
                dtype: Dtype::Bf16,
                ..args()
            })
            .contains("--backward")
        );
    }

    #[test]
    fn huge_weights_are_refused_before_allocating() {
        // 2^20 × 2^20 weights are 4 TiB: refused by validation before any input exists.
        let a = Args {
            seq: 1 << 20,
            seq_kv: None,
            batch: 1,
            heads: 1,
            kv_heads: None,
            head_dim: 1,
            weights: WeightsArg::All,
            ..args()
        };
        let msg = format!("{:#}", run(a).unwrap_err());
        assert!(msg.contains("attention weights would need"), "{msg}");
    }
}
