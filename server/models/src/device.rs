//! Choosing the device the decoder runs on (`--device auto|cpu|cuda[:N]`)
//! and reading its memory. The machine is seen through [`Gpus`], so the
//! choice is tested with a fake; the real one exists only in a `cuda` build.

use candle_core::Device;
use ferrox_plan::DeviceKind;

use crate::error::{Error, Result};
use crate::memory::{DeviceMemory, MemorySource};

/// What `--device` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The first CUDA device when this build has CUDA and one is present, else CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// CUDA device N.
    Cuda(usize),
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceChoice::Cuda)
                .ok_or_else(|| format!("`{other}` is not a device (auto, cpu, cuda or cuda:N)")),
        }
    }
}

/// One GPU as the driver describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// The product name.
    pub name: String,
    /// Free bytes now.
    pub free_bytes: u64,
    /// Total bytes.
    pub total_bytes: u64,
}

/// A device's memory and its allocator's pool, at one moment (see
/// [`crate::profile`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolReading {
    /// Free bytes on the device.
    pub free_bytes: u64,
    /// Bytes the pool has handed out.
    pub pool_used: u64,
    /// The most the pool had handed out at once since the last reset.
    pub pool_used_high: u64,
    /// Bytes the pool holds from the device (handed out or cached).
    pub pool_reserved: u64,
}

/// The GPUs of this machine, as far as this build can see them.
pub trait Gpus {
    /// How many there are, or why none can be used (`Err`: no CUDA in this
    /// build, or no driver).
    fn count(&self) -> std::result::Result<usize, String>;
    /// Opens GPU `ordinal`.
    fn open(&self, ordinal: usize) -> Result<Device>;
    /// Its name and memory, now.
    fn info(&self, device: &Device) -> Result<GpuInfo>;
    /// Its memory and its allocator pool's figures, once queued work is done.
    fn reading(&self, device: &Device) -> Result<PoolReading>;
    /// Starts a new high-water mark for [`PoolReading::pool_used_high`].
    fn reset_peak(&self, device: &Device) -> Result<()>;
}

/// The device chosen, and how to say so in the log.
#[derive(Debug, Clone)]
pub struct Selected {
    /// The candle device.
    pub device: Device,
    /// Its kind, for the plan.
    pub kind: DeviceKind,
    /// Name and memory, for the log.
    pub description: String,
}

/// Resolves `choice` on the machine `gpus` describes.
pub fn select(choice: DeviceChoice, gpus: &dyn Gpus) -> Result<Selected> {
    let cpu = || Selected {
        device: Device::Cpu,
        kind: DeviceKind::Cpu,
        description: "cpu".into(),
    };
    let ordinal = match (choice, gpus.count()) {
        (DeviceChoice::Cpu, _) => return Ok(cpu()),
        (DeviceChoice::Auto, Ok(n)) if n > 0 => 0,
        (DeviceChoice::Auto, _) => return Ok(cpu()),
        (DeviceChoice::Cuda(_), Err(why)) => {
            return Err(Error::Config(format!("--device cuda: {why}")));
        }
        (DeviceChoice::Cuda(n), Ok(count)) if n >= count => {
            return Err(Error::Config(format!(
                "--device cuda:{n}: this machine has {count} CUDA device(s)"
            )));
        }
        (DeviceChoice::Cuda(n), Ok(_)) => n,
    };
    let device = gpus.open(ordinal)?;
    let info = gpus.info(&device)?;
    Ok(Selected {
        description: format!(
            "cuda:{ordinal} ({}, {} of {} bytes free)",
            info.name, info.free_bytes, info.total_bytes
        ),
        device,
        kind: DeviceKind::Cuda,
    })
}

/// The memory to plan into on a GPU: what is free on it now (other
/// processes' use excluded).
pub fn gpu_memory(gpus: &dyn Gpus, device: &Device) -> Result<DeviceMemory> {
    Ok(DeviceMemory {
        bytes: gpus.info(device)?.free_bytes,
        source: MemorySource::Cuda,
    })
}

/// This machine's GPUs through the CUDA driver.
#[cfg(feature = "cuda")]
pub struct CudaGpus;

#[cfg(feature = "cuda")]
impl Gpus for CudaGpus {
    fn count(&self) -> std::result::Result<usize, String> {
        use candle_core::cuda_backend::cudarc::driver::CudaContext;
        CudaContext::device_count()
            .map(|n| n.max(0) as usize)
            .map_err(|e| format!("the CUDA driver is not usable here: {e}"))
    }

    fn open(&self, ordinal: usize) -> Result<Device> {
        Ok(Device::new_cuda(ordinal)?)
    }

    fn info(&self, device: &Device) -> Result<GpuInfo> {
        let cuda = device.as_cuda_device()?;
        let context = cuda.cuda_stream().context().clone();
        let driver = |e| Error::Config(format!("CUDA driver: {e}"));
        let (free, total) = context.mem_get_info().map_err(driver)?;
        Ok(GpuInfo {
            name: context.name().map_err(driver)?,
            free_bytes: free as u64,
            total_bytes: total as u64,
        })
    }

    fn reading(&self, device: &Device) -> Result<PoolReading> {
        use cudarc_pool::Attr;
        device.synchronize()?;
        let pool = cudarc_pool::default_pool(device)?;
        Ok(PoolReading {
            free_bytes: self.info(device)?.free_bytes,
            pool_used: cudarc_pool::get(pool, Attr::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            pool_used_high: cudarc_pool::get(pool, Attr::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
            pool_reserved: cudarc_pool::get(pool, Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
        })
    }

    fn reset_peak(&self, device: &Device) -> Result<()> {
        device.synchronize()?;
        let pool = cudarc_pool::default_pool(device)?;
        cudarc_pool::reset_high(pool)
    }
}

/// The device's default memory pool, which candle allocates from
/// (`cuMemAllocAsync`), read through the driver's pool attributes.
#[cfg(feature = "cuda")]
mod cudarc_pool {
    use candle_core::Device;
    use candle_core::cuda_backend::cudarc::driver::sys;

    use crate::error::{Error, Result};

    pub use sys::CUmemPool_attribute_enum as Attr;

    fn driver(what: &str, e: sys::CUresult) -> Error {
        Error::Config(format!("CUDA driver: {what}: {e:?}"))
    }

    pub fn default_pool(device: &Device) -> Result<sys::CUmemoryPool> {
        let cuda = device.as_cuda_device()?;
        let context = cuda.cuda_stream().context().clone();
        context
            .bind_to_thread()
            .map_err(|e| Error::Config(format!("CUDA driver: {e}")))?;
        let mut pool = std::mem::MaybeUninit::uninit();
        // SAFETY: the context is current and `pool` is written by the call.
        match unsafe { sys::cuDeviceGetDefaultMemPool(pool.as_mut_ptr(), context.cu_device()) } {
            sys::CUresult::CUDA_SUCCESS => Ok(unsafe { pool.assume_init() }),
            e => Err(driver("cuDeviceGetDefaultMemPool", e)),
        }
    }

    pub fn get(pool: sys::CUmemoryPool, attr: Attr) -> Result<u64> {
        let mut value: u64 = 0;
        // SAFETY: these attributes are cuuint64_t, written into `value`.
        let r = unsafe { sys::cuMemPoolGetAttribute(pool, attr, (&mut value as *mut u64).cast()) };
        match r {
            sys::CUresult::CUDA_SUCCESS => Ok(value),
            e => Err(driver("cuMemPoolGetAttribute", e)),
        }
    }

    pub fn reset_high(pool: sys::CUmemoryPool) -> Result<()> {
        let mut zero: u64 = 0;
        // SAFETY: the high-water mark may only be set to zero, as here.
        let r = unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                Attr::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                (&mut zero as *mut u64).cast(),
            )
        };
        match r {
            sys::CUresult::CUDA_SUCCESS => Ok(()),
            e => Err(driver("cuMemPoolSetAttribute", e)),
        }
    }
}

/// A build without CUDA: no GPUs, and it says why.
#[cfg(not(feature = "cuda"))]
pub struct CudaGpus;

#[cfg(not(feature = "cuda"))]
impl Gpus for CudaGpus {
    fn count(&self) -> std::result::Result<usize, String> {
        Err("this ferrox-server was built without CUDA (build it with scripts/build-cuda)".into())
    }

    fn open(&self, ordinal: usize) -> Result<Device> {
        Err(Error::Config(format!(
            "no CUDA in this build to open cuda:{ordinal}"
        )))
    }

    fn info(&self, _device: &Device) -> Result<GpuInfo> {
        Err(Error::Config("no CUDA in this build".into()))
    }

    fn reading(&self, _device: &Device) -> Result<PoolReading> {
        Err(Error::Config("no CUDA in this build".into()))
    }

    fn reset_peak(&self, _device: &Device) -> Result<()> {
        Err(Error::Config("no CUDA in this build".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine with `count` GPUs (opened as the CPU, which the selection
    /// never looks inside), or none with a reason.
    struct FakeGpus(std::result::Result<usize, &'static str>);

    impl Gpus for FakeGpus {
        fn count(&self) -> std::result::Result<usize, String> {
            self.0.map_err(String::from)
        }
        fn open(&self, _ordinal: usize) -> Result<Device> {
            Ok(Device::Cpu)
        }
        fn info(&self, _device: &Device) -> Result<GpuInfo> {
            Ok(GpuInfo {
                name: "NVIDIA H200".into(),
                free_bytes: 140 << 30,
                total_bytes: 143 << 30,
            })
        }
        fn reading(&self, _device: &Device) -> Result<PoolReading> {
            unreachable!("selection never reads the pool")
        }
        fn reset_peak(&self, _device: &Device) -> Result<()> {
            unreachable!("selection never resets the pool")
        }
    }

    #[test]
    fn choices_parse() {
        use DeviceChoice::*;
        for (text, want) in [
            ("auto", Auto),
            ("cpu", Cpu),
            ("cuda", Cuda(0)),
            ("cuda:3", Cuda(3)),
        ] {
            assert_eq!(text.parse::<DeviceChoice>(), Ok(want));
        }
        assert!(
            "gpu"
                .parse::<DeviceChoice>()
                .unwrap_err()
                .contains("cuda:N")
        );
        assert!("cuda:x".parse::<DeviceChoice>().is_err());
    }

    #[test]
    fn selection_follows_the_machine() {
        use DeviceChoice::*;
        let none = FakeGpus(Err("built without CUDA"));
        let two = FakeGpus(Ok(2));
        let zero = FakeGpus(Ok(0));
        let kind = |c, g: &FakeGpus| select(c, g).map(|s| s.kind).map_err(|e| e.to_string());
        assert_eq!(kind(Auto, &none), Ok(DeviceKind::Cpu));
        assert_eq!(kind(Auto, &zero), Ok(DeviceKind::Cpu));
        assert_eq!(kind(Auto, &two), Ok(DeviceKind::Cuda));
        assert_eq!(kind(Cpu, &two), Ok(DeviceKind::Cpu));
        assert_eq!(kind(Cuda(1), &two), Ok(DeviceKind::Cuda));
        assert!(
            kind(Cuda(0), &none)
                .unwrap_err()
                .contains("built without CUDA")
        );
        assert!(
            kind(Cuda(2), &two)
                .unwrap_err()
                .contains("has 2 CUDA device")
        );
        assert!(
            kind(Cuda(0), &zero)
                .unwrap_err()
                .contains("has 0 CUDA device")
        );
        let s = select(Auto, &two).unwrap();
        assert!(
            s.description.contains("cuda:0 (NVIDIA H200"),
            "{}",
            s.description
        );
        let m = gpu_memory(&two, &s.device).unwrap();
        assert_eq!((m.bytes, m.source), (140 << 30, MemorySource::Cuda));
    }

    #[test]
    fn this_build_reports_its_gpus_honestly() {
        let got = CudaGpus.count();
        if cfg!(feature = "cuda") {
            // A CUDA build here sees the driver's answer (0 without a GPU).
            assert!(got.is_ok() || got.unwrap_err().contains("driver"));
        } else {
            assert!(got.unwrap_err().contains("built without CUDA"));
            assert!(select(DeviceChoice::Cuda(0), &CudaGpus).is_err());
            assert_eq!(
                select(DeviceChoice::Auto, &CudaGpus).unwrap().kind,
                DeviceKind::Cpu
            );
        }
    }
}
