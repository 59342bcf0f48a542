<#
.SYNOPSIS
  Installs the vllm-ternary WSL2 distribution from the tarball `nox -s wsl-wsl2` builds.
.EXAMPLE
  .\install.ps1 -Tarball .\vllm-ternary-wsl2.tar.gz
#>
param(
    [Parameter(Mandatory = $true)][string]$Tarball,
    [string]$Name = "vllm-ternary",
    [string]$InstallDir = (Join-Path $env:LOCALAPPDATA "vllm-ternary")
)
$ErrorActionPreference = "Stop"

if (-not (Get-Command wsl.exe -ErrorAction SilentlyContinue)) {
    throw "wsl.exe not found: enable WSL with 'wsl --install --no-distribution' (admin), reboot, run again"
}
if (-not (Test-Path $Tarball)) {
    throw "tarball '$Tarball' does not exist: build it with 'nox -s wsl-wsl2' or download the release asset"
}
$existing = (wsl.exe --list --quiet) -replace "`0", "" | Where-Object { $_ -eq $Name }
if ($existing) {
    throw "a WSL distribution named '$Name' exists: pass -Name <other> or 'wsl --unregister $Name' first"
}
# The GPU comes from the Windows NVIDIA driver (nothing to install inside Linux); WSL 2 only.
wsl.exe --set-default-version 2 | Out-Null
New-Item -ItemType Directory -Force -Path $InstallDir | Out-Null
Write-Host "importing $Tarball as '$Name' into $InstallDir ..."
wsl.exe --import $Name $InstallDir $Tarball --version 2
if ($LASTEXITCODE -ne 0) { throw "wsl --import failed (exit $LASTEXITCODE)" }
Write-Host "first-boot check (ternary doctor) ..."
wsl.exe -d $Name -u root -- /usr/local/lib/ternary/first-boot.sh
if ($LASTEXITCODE -ne 0) {
    Write-Warning "ternary doctor reported failures: follow the fixes above, then 'wsl -d $Name -- ternary doctor'"
}
Write-Host "done: 'wsl -d $Name' starts it"
